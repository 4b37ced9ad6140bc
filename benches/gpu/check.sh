#!/usr/bin/env bash
# The GPU check: every GPU test, `eagervm bench --cuda`, the NCCL benchmark and one-rank
# data-parallel training over NCCL, run on a GPU machine from binaries built elsewhere
# (docs/cuda.md, "The GPU check").
#
#   benches/gpu/check.sh prepare   # here: build, strip and pack the binaries into
#                                  # target/gpu-check/ (an ignored folder), print its size
#   benches/gpu/check.sh run       # there, from the repository root, with target/gpu-check
#                                  # carried: run everything, logs under $OUT (or
#                                  # target/gpu-check/out); exit status 1 if a step failed
#
# `run` needs no cargo and no network. It finds libnccl (and NVRTC and cuBLAS, when the
# loader does not) in the `nvidia` Python packages' lib/ folders, unless EAGERVM_NCCL_LIB
# names a library. Without a GPU it says so, skips the GPU tests, and the benchmarks print
# why they skip. `run --full` runs the whole integration suite with the GPU tests
# (--include-ignored) instead of the GPU tests alone.
# Time limits in seconds: per step GPU_CHECK_TEST_S (default 240) and GPU_CHECK_BENCH_S
# (150); all steps end by GPU_CHECK_DEADLINE_S (570) after the start.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
pack=target/gpu-check
bins=(unittests integration eagervm allreduce_nccl)

die() {
    echo "gpu check: $*" >&2
    exit 2
}

prepare() {
    set -e
    command -v jq > /dev/null || die "prepare needs jq (to read cargo's JSON messages)"
    local target=${CARGO_TARGET_DIR:-$root/target}
    local msgs
    msgs=$(mktemp)
    # The test binaries (the library's unit tests, the integration suite), the command line
    # and the NCCL benchmark, in the release profile (the bench profile has the same
    # settings, so nothing is compiled twice).
    nice -n 10 cargo test --release --no-run --lib --test integration --message-format=json > "$msgs"
    nice -n 10 cargo build --release --bin eagervm --message-format=json >> "$msgs"
    nice -n 10 cargo bench --no-run --bench allreduce_nccl --message-format=json >> "$msgs"
    exe() { # the executable of target $1 of kind $2, tests or not ($3)
        jq -r --arg n "$1" --arg k "$2" --argjson t "$3" 'select(.reason == "compiler-artifact"
            and .executable != null and .target.name == $n and (.target.kind | any(. == $k))
            and .profile.test == $t) | .executable' "$msgs" | tail -n 1
    }
    local from=("$(exe eagervm lib true)" "$(exe integration test true)" "$(exe eagervm bin false)"
        "$(exe allreduce_nccl bench true)")
    rm -f "$msgs"
    rm -rf "$pack"
    mkdir -p "$pack/bin"
    local i
    for i in "${!bins[@]}"; do
        [ -x "${from[$i]}" ] || die "no executable for ${bins[$i]} in cargo's messages"
        # Without debug info: symbols stay (panics name their functions), the size drops ~6x.
        objcopy --strip-debug "${from[$i]}" "$pack/bin/${bins[$i]}"
    done
    # Paths compiled into the tests: the source tree (env!("CARGO_MANIFEST_DIR"), where the
    # shipped traces are read) and the command line (env!("CARGO_BIN_EXE_eagervm")).
    {
        echo "manifest_dir=$root"
        echo "bin_exe=$target/release/eagervm"
        echo "commit=$(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with changes)')"
        echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        # The newest glibc symbol version the binaries need: the GPU machine needs as new a glibc.
        echo "glibc=$(for f in "${from[@]}"; do objdump -T "$f"; done | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -n 1 | cut -c7-)"
    } > "$pack/build.env"
    tar -czf "$pack/bin.tar.gz" -C "$pack" bin
    rm -rf "$pack/bin"
    du -b "$pack/bin.tar.gz" | awk '{printf "%s: %.1f MiB packed\n", $2, $1 / 1048576}'
    echo "the binaries need glibc $(sed -n 's/^glibc=//p' "$pack/build.env") or later"
    local tree packed
    tree=$(git ls-files -z | xargs -0 du -cb | tail -n 1 | cut -f1)
    packed=$(du -cb "$pack" | tail -n 1 | cut -f1)
    awk -v t="$tree" -v p="$packed" 'BEGIN { printf "tracked files %.1f MiB + %.1f MiB = %.1f MiB of the 64 MiB a run may carry\n", t / 1048576, p / 1048576, (t + p) / 1048576; exit (t + p > 60 * 1048576) }' ||
        die "too large to carry"
    echo "now, on the GPU machine: benches/gpu/check.sh run   (carrying $pack)"
}

# "FAMILY DIR" lines: the lib/ folders of the `nvidia` Python packages that hold libnccl,
# NVRTC or cuBLAS.
python_cuda_libs() {
    command -v python3 > /dev/null || return 0
    python3 - << 'EOF' 2> /dev/null
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
seen = set()
for base in nvidia.__path__:
    for so in sorted(glob.glob(os.path.join(base, "**", "lib", "lib*.so*"), recursive=True)):
        name, d = os.path.basename(so), os.path.dirname(so)
        for family in ("libnccl", "libnvrtc", "libcublas"):
            if name.startswith(family + ".so") and (family, d) not in seen:
                seen.add((family, d))
                print(family, d)
EOF
}

run() {
    local full=0
    [ "${1:-}" = "--full" ] && full=1
    [ -f "$pack/bin.tar.gz" ] && [ -f "$pack/build.env" ] ||
        die "no $pack/bin.tar.gz: run 'benches/gpu/check.sh prepare' where cargo is, and carry $pack"
    local out=${OUT:-$pack/out}
    mkdir -p "$out"
    local bin
    bin=$(mktemp -d)
    tar -xzf "$pack/bin.tar.gz" -C "$bin" || die "cannot unpack $pack/bin.tar.gz"
    bin=$bin/bin
    local manifest_dir bin_exe
    manifest_dir=$(sed -n 's/^manifest_dir=//p' "$pack/build.env")
    bin_exe=$(sed -n 's/^bin_exe=//p' "$pack/build.env")
    local summary=$out/summary.txt
    : > "$summary"
    say() { echo "$*" | tee -a "$summary"; }
    say "gpu check of $(sed -n 's/^commit=//p' "$pack/build.env"), built $(sed -n 's/^built=//p' "$pack/build.env"); here $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"

    # The paths the tests were compiled with, where this machine has nothing there.
    if [ ! -e "$manifest_dir/instructions" ]; then
        if mkdir -p "$(dirname "$manifest_dir")" 2> /dev/null && ln -sfn "$root" "$manifest_dir" 2> /dev/null; then
            say "linked $manifest_dir -> $root (the source tree the tests were built in)"
        else
            say "cannot link $manifest_dir -> $root: the tests that read the shipped traces will fail"
        fi
    fi
    if [ ! -x "$bin_exe" ]; then
        if mkdir -p "$(dirname "$bin_exe")" 2> /dev/null && ln -sf "$bin/eagervm" "$bin_exe" 2> /dev/null; then
            say "linked $bin_exe -> the carried eagervm"
        else
            say "cannot link $bin_exe: the tests that start eagervm will fail"
        fi
    fi

    # Libraries: libnccl from Python's `nvidia` packages (nvidia-nccl-cu13), and NVRTC and
    # cuBLAS from there too where the loader finds none; after what LD_LIBRARY_PATH names.
    local family dir libs=""
    while read -r family dir; do
        [ -n "$family" ] || continue
        if [ "$family" != libnccl ] && ldconfig -p 2> /dev/null | grep -q "$family\.so"; then
            continue
        fi
        case ":$libs:" in *":$dir:"*) ;; *) libs=${libs:+$libs:}$dir ;; esac
    done <<< "$(python_cuda_libs)"
    if [ -n "$libs" ]; then
        export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$libs
        say "LD_LIBRARY_PATH += $libs"
    else
        say "no libnccl (nor a missing NVRTC or cuBLAS) found in Python's nvidia packages"
    fi
    {
        echo "== nvidia-smi"
        nvidia-smi 2>&1 || echo "(no nvidia-smi)"
        echo "== python: torch, nccl"
        python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")' 2>&1
        echo "== LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
        echo "== nproc $(nproc)"
    } > "$out/00-machine.log" 2>&1

    # Whether the VM can open cuda:0, asked of eagervm itself (nothing measured).
    local probe gpu=1
    probe=$("$bin/eagervm" bench --cuda --chain 0 --chunks 0 --steps 0 -r 1 2>&1) ||
        die "the carried eagervm fails here (it was built for glibc $(sed -n 's/^glibc=//p' "$pack/build.env") or later): $probe"
    if grep -q "cuda benchmarks skipped" <<< "$probe"; then
        gpu=0
        say "no usable GPU: $(grep -o 'cuda:0 is not available.*' <<< "$probe")"
    fi

    local failed=0
    # step NAME LIMIT COMMAND...: run it with its output in $out/NAME.log, say how it ended.
    # Every step ends by the deadline, so that the logs are written whatever hangs.
    local deadline=$((SECONDS + ${GPU_CHECK_DEADLINE_S:-570}))
    step() {
        local name=$1 limit=$2
        shift 2
        local left=$((deadline - SECONDS - 15))
        if [ "$left" -lt 10 ]; then
            say "$(printf '%-22s %s' "$name" "NOT RUN: the deadline has passed")"
            failed=1
            return
        fi
        [ "$limit" -le "$left" ] || limit=$left
        local t0=$SECONDS rc=0
        timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1 || rc=$?
        local how="ok"
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            how="TIMED OUT after ${limit}s"
        elif [ "$rc" -ne 0 ]; then
            how="FAILED (exit $rc)"
        fi
        [ "$rc" -eq 0 ] || failed=1
        local tally
        tally=$(grep -E '^test result:|skipped:' "$out/$name.log" | tail -n 1)
        say "$(printf '%-22s %-22s %4ss  %s' "$name" "$how" $((SECONDS - t0)) "$tally")"
    }
    local test_s=${GPU_CHECK_TEST_S:-240} bench_s=${GPU_CHECK_BENCH_S:-150}
    if [ "$gpu" -eq 1 ]; then
        # The child-process body of an out-of-memory test is ignored too, and is no GPU test.
        if [ "$full" -eq 1 ]; then
            step 10-integration "$test_s" "$bin/integration" --include-ignored --skip child_allocations_beyond_the_machine
        else
            step 10-gpu-tests "$test_s" "$bin/integration" --ignored --skip child_allocations_beyond_the_machine
        fi
        # The unit tests take their GPU branches (a real one-rank NCCL communicator, the
        # benchmarks' reports) where a GPU is.
        step 20-unit-tests "$test_s" "$bin/unittests"
        # One-rank data-parallel training over NCCL, as torchrun would start it.
        step 30-mlp-dp-nccl 120 env WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 \
            "$bin/eagervm" run mlp-dp --backend nccl
    else
        say "GPU tests, unit tests and mlp-dp over NCCL not run: no usable GPU"
    fi
    step 40-bench-cuda "$bench_s" "$bin/eagervm" bench --cuda
    step 50-allreduce-nccl "$bench_s" env EAGERVM_NCCL_JSON="$out/allreduce_nccl.json" "$bin/allreduce_nccl"
    for f in 40-bench-cuda 50-allreduce-nccl; do
        echo "== $f"
        cat "$out/$f.log"
    done
    echo "== summary"
    cat "$summary"
    echo "logs in $out"
    rm -rf "$(dirname "$bin")"
    return $failed
}

case "${1:-}" in
    prepare) prepare ;;
    run) run "${2:-}" ;;
    *) die "usage: $0 prepare | run [--full]" ;;
esac
