"""Hardware and model catalogues, memory plan, cost model, calibration."""
