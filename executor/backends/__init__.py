"""Sandbox backends. Import the concrete ones from ``executor`` (the Docker and WASM ones load lazily)."""
