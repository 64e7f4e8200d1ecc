"""Names of the sandbox images (the build logic lives here too)."""

BASE_IMAGE = "adk-sandbox/base:latest"
RUST_IMAGE = "adk-sandbox/rust:latest"
BOOTSTRAP_IMAGE = "adk-sandbox/debian:trixie"
