"""Sandbox backends. Import them from ``adk_sandbox.executor`` (the Docker and WASM ones load lazily)."""
