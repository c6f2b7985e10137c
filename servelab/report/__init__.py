"""Terminal tables, JSON, and the HTML report."""
