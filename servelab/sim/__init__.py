"""The simulated vLLM V1 engine: scheduler, paged KV cache with prefix caching, engine loop."""
