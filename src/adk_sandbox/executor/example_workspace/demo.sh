#!/bin/sh
# What `adk-sandbox run` shows when given no workspace and no command: where it runs and what it may do.
echo "== running as uid:gid $(id -u):$(id -g) in $(pwd) on host '$(hostname)'"
echo "== network interfaces: $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')"
echo "== capabilities: $(grep CapEff /proc/self/status | cut -f2)  no-new-privileges: $(grep NoNewPrivs /proc/self/status | cut -f2)"
if touch /usr/sandbox-test 2>/dev/null; then echo "== root filesystem: WRITABLE"; else echo "== root filesystem: read-only"; fi
python3 primes.py 20
echo "== files written here stay yours on the host:"
date > last-run.txt && ls -ln last-run.txt
