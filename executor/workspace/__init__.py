"""How a host workspace reaches a sandbox: the transports, the mirror, the copies, the descriptor resolver."""
