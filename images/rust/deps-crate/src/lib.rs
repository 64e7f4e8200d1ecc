//! Forces serde_json to be compiled; the rlibs are what the image keeps.
pub use serde_json;
