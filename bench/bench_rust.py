"""The Rust pipeline warm path against cargo, side by side in one run, through the same backend.

Run: .venv/bin/python bench/bench_rust.py [--backend process|docker] [--snippets N] [--quick]

* warm snippet: RustExecutor.run (check + build + run) of N different snippets after one warm-up call,
  once with the default settings and once with ``incremental=True``; p50 and p90 of the whole call.
* cold cargo build: a fresh cargo project of the *same program* (harness included), serde_json from
  Debian's registry offline, empty target dir, ``cargo build`` (debug) then run the binary.
* warm cargo rebuild: the same project after touching main.rs, then run.

Every step runs through the chosen backend (``docker`` needs the Docker backend and the
``adk-sandbox/rust`` image with Debian's librust-serde-json-dev; imported lazily). ``ADK_BENCH_RUST_IMAGE``
names another image to measure (e.g. one built under a tag of its own before it replaces that one).
Prints a Markdown section for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import statistics
import tempfile
import time
from collections.abc import Iterator

from _timing import Row, Stats, percentile

from adk_sandbox.executor import ExecRequest, Language, ProcessBackend, SandboxBackend
from adk_sandbox.executor.rust import RustExecutor, RustExecutorConfig, host_rust, wrap_in_harness

REGISTRY = "/usr/share/cargo/registry"

SNIPPETS = [
    "fn run(input: Value) -> Value {{\n"
    '    serde_json::json!({{"double": input["n"].as_i64().unwrap_or(0) * {k}}})\n}}',
    "fn run(input: Value) -> Value {{ let v: Vec<i64> = (0..{k}).map(|x| x * x).collect(); Value::from(v) }}",
    'fn run(_input: Value) -> Value {{ println!("side {k}"); Value::String("x".repeat({k})) }}',
    "fn run(input: Value) -> Value {{ let s = input.to_string(); Value::from(s.len() + {k}) }}",
    "fn fib(n: u64) -> u64 {{ if n < 2 {{ n }} else {{ fib(n - 1) + fib(n - 2) }} }}\n"
    "fn run(_input: Value) -> Value {{ Value::from(fib(20 + {k} % 3)) }}",
    "use std::collections::BTreeMap;\nfn run(_input: Value) -> Value {{\n"
    "    let mut m = BTreeMap::new();\n    for i in 0..{k} {{ m.insert(i.to_string(), i); }}\n"
    "    serde_json::to_value(m).unwrap()\n}}",
    "fn run(input: Value) -> Value {{ match input {{ Value::Array(a) => Value::from(a.len() + {k}), "
    "other => other }} }}",
    "struct P {{ x: i64 }}\nimpl P {{ fn norm(&self) -> i64 {{ self.x.abs() * {k} }} }}\n"
    "fn run(_input: Value) -> Value {{ Value::from(P {{ x: -3 }}.norm()) }}",
    "fn run(_input: Value) -> Value {{\n"
    "    let words = \"a b c d\".split(' ').count();\n    Value::from(words * {k})\n}}",
    "fn run(input: Value) -> Value {{ let mut o = serde_json::Map::new(); "
    'o.insert("k".into(), Value::from({k})); o.insert("in".into(), input); Value::Object(o) }}',
]


def warm_snippets(
    backend: SandboxBackend, config: RustExecutorConfig, count: int
) -> tuple[list[float], list[float]]:
    """Whole-call seconds and compile-step seconds of ``count`` different snippets after a warm-up."""
    with RustExecutor(backend, config) as executor:
        warm_up = executor.run(SNIPPETS[0].format(k=0), {"n": 1}, timeout=300)
        assert warm_up.status == "success", warm_up
        samples, compiles = [], []
        for i in range(count):
            code = SNIPPETS[i % len(SNIPPETS)].format(k=i + 1)
            started = time.perf_counter()
            result = executor.run(code, {"n": i}, timeout=300)
            samples.append(time.perf_counter() - started)
            assert result.status == "success", (code, result)
            compiles.append(result.timings_ms["compile"] / 1000)
    return samples, compiles


def two_pass_compiles(backend: SandboxBackend, work: str, count: int) -> list[float]:
    """Check (``--emit=metadata``) then build (``--emit=link``) as two rustc runs: the design not taken.

    Host rustc only; compared with the pipeline's single ``--emit=metadata,link`` run (compile step only).
    """
    host = host_rust()
    assert host is not None
    rustc = " ".join(shlex.quote(a) for a in (host.rustc, *host.args))
    deps = shlex.quote(host.deps_dir)
    common = (
        f"{rustc} --edition=2021 --crate-type=bin --crate-name=main --error-format=json --out-dir=. "
        f"-L dependency={deps} --extern serde_json={deps}/libserde_json.rlib"
    )
    samples = []
    for i in range(count + 1):
        program = wrap_in_harness(SNIPPETS[i % len(SNIPPETS)].format(k=i + 1)).text
        started = time.perf_counter()
        for step in (
            "mkdir -p {d} && cd {d} && cat > main.rs && {c} --emit=metadata main.rs",
            "cd {d} && {c} --emit=link main.rs",
        ):
            result = backend.execute(
                ExecRequest(
                    language=Language.COMMAND,
                    code=step.format(d=shlex.quote(f"{work}/two-pass-{i}"), c=common),
                    stdin=program,
                    timeout=300,
                )
            )
            assert result.exit_code == 0, result
        if i:  # the first one warms the page cache
            samples.append(time.perf_counter() - started)
    return samples


class CargoProject:
    """A cargo project in the backend's filesystem, built offline against Debian's crate sources."""

    def __init__(self, backend: SandboxBackend, root: str, env: dict[str, str]) -> None:
        self.backend, self.root, self.env = backend, root, env

    def _sh(self, script: str, stdin: str | None = None) -> float:
        started = time.perf_counter()
        result = self.backend.execute(
            ExecRequest(language=Language.COMMAND, code=script, stdin=stdin, timeout=600, env=self.env)
        )
        elapsed = time.perf_counter() - started
        assert result.exit_code == 0, result
        return elapsed

    def create(self, program: str) -> None:
        """Write the project (program on stdin, so the backend's filesystem need not be the host's)."""
        q = shlex.quote(self.root)
        self._sh(
            "\n".join(
                [
                    f"rm -rf {q} && mkdir -p {q}/src {q}/.cargo && cat > {q}/src/main.rs",
                    f"cat > {q}/Cargo.toml <<'EOF'",
                    '[package]\nname = "snippet"\nversion = "0.0.0"\nedition = "2021"',
                    '[dependencies]\nserde_json = "1"',
                    "EOF",
                    f"cat > {q}/.cargo/config.toml <<'EOF'",
                    '[source.crates-io]\nreplace-with = "debian"',
                    f'[source.debian]\ndirectory = "{REGISTRY}"',
                    "EOF",
                ]
            ),
            stdin=program,
        )

    def build_and_run(self, touch: bool = False) -> float:
        """Seconds for ``cargo build`` (offline, debug) and one run of the binary."""
        q = shlex.quote(self.root)
        prefix = f"touch {q}/src/main.rs && " if touch else ""
        run = "echo '{\"n\": 1}' | ./target/debug/snippet >/dev/null"
        return self._sh(f"{prefix}cd {q} && cargo build --offline --quiet && {run}")


RUST_IMAGE = os.environ.get("ADK_BENCH_RUST_IMAGE", "adk-sandbox/rust:latest")
"""The image of ``--backend docker`` (an image built under another tag can be measured before it replaces
``adk-sandbox/rust``)."""


@contextlib.contextmanager
def open_backend(name: str, scratch: str) -> Iterator[tuple[SandboxBackend, str, dict[str, str]]]:
    """The backend, a directory for the cargo project as it sees it, and the env cargo needs there."""
    if name == "process":
        host = host_rust()
        assert host is not None and host.deps_available, "run scripts/build-rust-deps first"
        # Cleared environment: the toolchain's own bin dir (the real cargo/rustc, not rustup's proxies).
        env = {
            "PATH": f"{host.sysroot}/bin:/usr/bin:/bin",
            "CARGO_HOME": os.path.join(scratch, "cargo-home"),
            "HOME": scratch,
        }
        with ProcessBackend() as backend:
            yield backend, os.path.join(scratch, "cargo-project"), env
    else:
        from adk_sandbox.executor.backends.docker import DockerBackend  # noqa: PLC0415

        with DockerBackend(image=RUST_IMAGE).session(workspace=scratch) as session:
            yield session, "/tmp/adk-bench/cargo-project", {"CARGO_HOME": "/tmp/adk-bench/cargo-home"}


def warm_rows(snippets: int) -> list[Row]:
    """Issue 11, benchmark 5: the warm p50 in a Docker session (agent channel) against the host pipeline.

    The two compilers differ (the image's Debian rustc, rustup's on the host): the anchor is the floor of
    the same pipeline without a container, not the same compiler.
    """
    stats, compile_stats = {}, {}
    for name in ("docker", "process"):
        with (
            tempfile.TemporaryDirectory(prefix="adk-bench-rust-") as scratch,
            open_backend(name, scratch) as (backend, _, _),
        ):
            samples, compiles = warm_snippets(backend, RustExecutorConfig(), snippets)
        stats[name] = Stats(tuple(s * 1000 for s in samples))
        compile_stats[name] = Stats(tuple(s * 1000 for s in compiles))
    ours, host = stats["docker"], stats["process"]
    ours_compile, host_compile = compile_stats["docker"], compile_stats["process"]
    return [
        Row(
            f"runc: warm Rust snippet (check+build+run), Docker session ({RUST_IMAGE})",
            f"p50 {ours.p50 / 1000:.3f} / p90 {ours.p90 / 1000:.3f} s",
            "the same pipeline on the host (ProcessBackend)",
            f"p50 {host.p50 / 1000:.3f} / p90 {host.p90 / 1000:.3f} s",
            ours.p50 / host.p50,
            "p50 ≤ 0.35 s",
            ours.p50 <= 350,
        ),
        # The split: what of the call is the compile step (rustc in the container vs on the host).
        Row(
            "of which the compile step (timings_ms['compile'])",
            f"p50 {ours_compile.p50 / 1000:.3f} / p90 {ours_compile.p90 / 1000:.3f} s",
            "the host pipeline's compile step",
            f"p50 {host_compile.p50 / 1000:.3f} / p90 {host_compile.p90 / 1000:.3f} s",
            ours_compile.p50 / host_compile.p50,
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["process", "docker"], default="process")
    parser.add_argument("--snippets", type=int, default=10)
    parser.add_argument("--cold", type=int, default=3, help="cold cargo builds (each from an empty target)")
    parser.add_argument("--quick", action="store_true", help="5 snippets, one cold build")
    args = parser.parse_args()
    if args.quick:
        args.snippets, args.cold = 5, 1

    with (
        tempfile.TemporaryDirectory(prefix="adk-bench-rust-") as scratch,
        open_backend(args.backend, scratch) as (
            backend,
            project_root,
            cargo_env,
        ),
    ):
        warm, warm_compile = warm_snippets(backend, RustExecutorConfig(), args.snippets)
        warm_incremental, _ = warm_snippets(backend, RustExecutorConfig(incremental=True), args.snippets)
        two_pass = two_pass_compiles(backend, scratch, args.snippets) if args.backend == "process" else []

        program = wrap_in_harness(SNIPPETS[0].format(k=1)).text
        project = CargoProject(backend, project_root, cargo_env)
        cold = []
        for _ in range(args.cold):
            project.create(program)
            cold.append(project.build_and_run())
        rebuild = [project.build_and_run(touch=True) for _ in range(5)]

    p50 = statistics.median(warm)
    rows = [
        ("warm snippet, RustExecutor (check+build+run)", warm),
        ("warm snippet, RustExecutor with `incremental=True`", warm_incremental),
        ("compile step alone: one rustc `--emit=metadata,link` (the pipeline's)", warm_compile),
        ("compile alone: two rustc runs, `--emit=metadata` then `--emit=link`", two_pass),
        ("cold `cargo build` + run (empty target dir, serde_json compiled)", cold),
        ("warm `cargo build` + run after touching main.rs", rebuild),
    ]
    today = time.strftime("%Y-%m-%d")
    print(f"backend={args.backend}, {args.snippets} snippets, {os.cpu_count()} cpus, {today}\n")
    print("| what | n | p50 s | p90 s | ratio to warm snippet p50 |")
    print("|---|---|---|---|---|")
    for name, samples in rows:
        if not samples:
            continue
        median, p90 = statistics.median(samples), percentile(samples, 0.9)
        print(f"| {name} | {len(samples)} | {median:.3f} | {p90:.3f} | {median / p50:.2f}x |")
    print()
    for target in (1.0, 0.35):  # the first issue's target, then issue 11's for the Docker session
        print(f"target warm p50 <= {target} s: {'met' if p50 <= target else 'NOT met'} ({p50:.3f} s)")


if __name__ == "__main__":
    main()
