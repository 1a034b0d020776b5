"""Model providers: a client for OpenAI-compatible chat completions (``client``) and a local
stub that speaks the same API (``stub``), for tests, benchmarks and the offline demo."""
