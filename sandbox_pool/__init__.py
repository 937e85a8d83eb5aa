"""sandbox_pool: isolated, warm, millisecond Python tool execution (embedded, HTTP, Redis)."""
