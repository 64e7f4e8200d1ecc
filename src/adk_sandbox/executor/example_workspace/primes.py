"""A tiny program for the example workspace: print the first N primes."""

import sys

count = int(sys.argv[1]) if len(sys.argv) > 1 else 10
primes: list[int] = []
candidate = 2
while len(primes) < count:
    if all(candidate % p for p in primes):
        primes.append(candidate)
    candidate += 1
print("== first", count, "primes:", " ".join(map(str, primes)))
