"""The Docker backend: per-session hardened containers, and the images they run (:mod:`.images`)."""
