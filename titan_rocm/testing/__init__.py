"""Code that exists for tests and worker processes (fault injection, graph audit):
the runtime never imports it."""
