#!/usr/bin/env python3
"""A small, real PyTorch DDP training job for the aegis-flow demo, tests and benchmarks.

Run it the way torchrun (or an aegis-flow supervisor) does: one process per rank, with RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT and LOCAL_RANK in the environment, e.g.::

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 \\
        python examples/train_ddp.py --steps 50 &
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 \\
        python examples/train_ddp.py --steps 50

Standard library and torch only (aegis-flow, when importable, for its progress hook and the
checkpoint manifests of ``--keep``). Side effects: network (the process group), files (rank 0
writes ``<checkpoint-dir>/latest.pt`` and, with ``--keep K`` > 1, ``ckpt-<step>.pt``; every rank
reads one of them), stdout.

Output (everything else is silent):

* every rank, at start: ``rank R/W restart_count C backend B``;
* every rank that resumes: ``resumed from step X``;
* with ``AEGIS_TIMING=1`` (the benchmarks and tests that time recoveries set it), every rank,
  right after its first optimizer step in this process:
  ``AEGIS_FIRST_STEP <unix time>`` and, on the next line,
  ``AEGIS_FIRST_STEP_INFO rank R restart N pid P at <the same time>`` (N: AEGIS_RESTART_COUNT,
  else TORCHELASTIC_RESTART_COUNT, else 0); the recovery benchmark reads them; then
  ``AEGIS_INIT rank R restart N seconds S``: the CUDA device, process group and (NCCL) first
  collective's setup time of this process (``bench/gpu_check.py`` reads it);
* rank 0, every ``--checkpoint-every`` steps: ``step S loss L``;
* with ``AEGIS_TIMING=1``, every rank, at the end: ``AEGIS_RATE <steps/s>`` over the steps
  this process ran, not
  counting the first one (``nan`` when it ran fewer than two; the overhead benchmark reads it);
* rank 0, at the end: ``done: final step N, loss L, params checksum C``.

Steps are numbered 1..N. After step S with S % K == 0, every rank meets at a barrier and rank 0
saves ``{step, model, optimizer}`` atomically (tmp file, fsync, ``os.replace``) to ``latest.pt``.
With ``--keep K`` > 1 it also saves ``ckpt-<step>.pt`` (atomically, before ``latest.pt``), writes
its manifest with ``aegis_flow.supervisor.integrity.record`` when aegis-flow is importable
(``ckpt-<step>.pt.aegis-sha256.json``), and deletes all but the newest K ``ckpt-<step>.pt`` (and
their manifests; a checkpoint an integrity gate moved aside is never touched). A new process loads
``$AEGIS_RESUME_FROM`` when it names an existing file (the integrity gate's choice, e.g.
``<checkpoint-dir>/aegis-resume``), else ``latest.pt`` if present, and continues at
``step + 1``.

What equality holds: the batch of step S on rank R depends only on (seed, S, R), the checkpoint
holds the parameters *and* the optimizer state (SGD momentum) after step S, and a crash injected
with ``--fail-at-step`` happens before that step's computation. So an interrupted run resumed
from any checkpoint repeats exactly the same sequence of operations as an uninterrupted run and
ends at the same final step with the same parameters: bitwise equal on the same machine, build
and thread count (OMP_NUM_THREADS) — tests compare the checksum within a 1e-5 relative tolerance.
A different world size or backend gives different, equally valid, numbers.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

# torch built without numpy warns on import; harmless here, and it clutters every rank's log.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

try:  # optional progress hook for the aegis-flow hang detector
    from aegis_flow import progress as _progress  # type: ignore[attr-defined, unused-ignore]
except ImportError:
    _progress = None

try:  # optional: a fault-tolerance checkpoint round the aegis-flow master asks for
    from aegis_flow.checkpoint import requested as _requested
except ImportError:
    _requested = None  # type: ignore[assignment, unused-ignore]

try:  # optional checkpoint manifests (--keep K > 1) for the aegis-flow integrity gate
    from aegis_flow.supervisor import integrity as _integrity
except ImportError:
    _integrity = None  # type: ignore[assignment, unused-ignore]

IN_DIM, HIDDEN, OUT_DIM, BATCH = 16, 32, 4, 64
CHECKPOINT_NAME = "latest.pt"
KEPT_RE = re.compile(r"ckpt-(\d+)\.pt")  # the --keep checkpoints, exactly (not *.damaged-*)
# the benchmark markers (AEGIS_FIRST_STEP*, AEGIS_RATE): only when asked for
TIMING = os.environ.get("AEGIS_TIMING", "").strip().lower() in ("1", "true", "yes", "on")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--steps", type=int, default=200, help="last step to run (default 200)")
    p.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("AEGIS_CHECKPOINT_DIR") or "./checkpoints",
        help="where latest.pt lives (default $AEGIS_CHECKPOINT_DIR or ./checkpoints)",
    )
    p.add_argument("--checkpoint-every", type=int, default=10, help="checkpoint period K")
    p.add_argument(
        "--keep", type=int, default=1,
        help="checkpoints to keep: 1 (default) only latest.pt; K > 1 also ckpt-<step>.pt, "
        "the newest K of them",
    )
    p.add_argument(
        "--step-time", type=float, default=0.05, help="extra sleep per step, seconds (0.05)"
    )
    p.add_argument("--fail-at-step", type=int, default=None, help="crash at this step (tests)")
    p.add_argument("--fail-rank", type=int, default=0, help="rank that crashes (default 0)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    p.add_argument("--pg-timeout", type=float, default=60.0, help="process group timeout, s")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 1 or args.step_time < 0 or args.keep < 1:
        p.error("--steps must be >= 0, --checkpoint-every >= 1, --step-time >= 0 and --keep >= 1")
    return args


def env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if default is None:
            sys.exit(
                f"train_ddp: environment variable {name} is not set (run under torchrun or "
                "an aegis-flow supervisor, or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"
            )
        return default
    try:
        return int(raw)
    except ValueError:
        sys.exit(f"train_ddp: {name}={raw!r} is not an integer")


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT_DIM))


def batch(seed: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic regression data, a pure function of (seed, step, rank)."""
    teacher = torch.Generator().manual_seed(seed)
    w = torch.randn(IN_DIM, OUT_DIM, generator=teacher)
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 7919 + rank)
    x = torch.randn(BATCH, IN_DIM, generator=g)
    y = torch.sin(x @ w) + 0.01 * torch.randn(BATCH, OUT_DIM, generator=g)
    return x, y


def checksum(model: nn.Module) -> float:
    return float(sum(p.detach().double().sum().item() for p in model.parameters()))


def save_checkpoint(path: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """Atomic: a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    state = {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def save_kept(directory: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer,
              keep: int) -> None:
    """Save ``ckpt-<step>.pt`` (atomic) and its manifest (with aegis-flow); keep the newest K."""
    path = directory / f"ckpt-{step}.pt"
    save_checkpoint(path, step, model, opt)
    if _integrity is not None:
        try:
            _integrity.record(path)
        except OSError as exc:  # a manifest is a help, never a reason to stop training
            print(f"train_ddp: no manifest for {path.name}: {exc!r}", file=sys.stderr, flush=True)
    kept = sorted(
        (int(m.group(1)), p)
        for p in directory.iterdir()
        if (m := KEPT_RE.fullmatch(p.name)) and p.is_file() and not p.is_symlink()
    )
    for _, old in kept[:-keep]:
        for doomed in (old, old.with_name(old.name + ".aegis-sha256.json")):
            try:
                doomed.unlink()
            except FileNotFoundError:
                pass


def resume_path(checkpoint_dir: Path) -> Path:
    """``$AEGIS_RESUME_FROM`` when it names an existing file, else ``latest.pt``."""
    chosen = os.environ.get("AEGIS_RESUME_FROM", "")
    if chosen and Path(chosen).is_file():
        return Path(chosen)
    return checkpoint_dir / CHECKPOINT_NAME


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


def report_progress(step: int) -> None:
    global _progress
    if _progress is None:
        return
    try:
        _progress.step(step)
    except Exception as exc:  # the hook must never stop training
        print(f"train_ddp: progress hook disabled: {exc!r}", file=sys.stderr, flush=True)
        _progress = None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = env_int("RANK")
    world = env_int("WORLD_SIZE")
    local_rank = env_int("LOCAL_RANK", rank)
    restart_count = env_int("AEGIS_RESTART_COUNT", 0)
    master_addr = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    master_port = env_int("MASTER_PORT")

    init_started = time.time()  # CUDA device + process group (+ NCCL) init: AEGIS_INIT
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    print(f"rank {rank}/{world} restart_count {restart_count} backend {backend}", flush=True)

    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=args.pg_timeout),
    )
    if backend == "nccl":  # NCCL's communicators are made lazily: include the first collective
        dist.barrier(device_ids=[local_rank])
    init_seconds = time.time() - init_started

    model = make_model(args.seed).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    ckpt_path = Path(args.checkpoint_dir) / CHECKPOINT_NAME
    last_done = 0
    state = load_checkpoint(resume_path(Path(args.checkpoint_dir)))
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        last_done = int(state["step"])
        print(f"resumed from step {last_done}", flush=True)

    # Every rank must resume from the same step (e.g. a rank that cannot see the checkpoint dir).
    steps = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(steps, torch.tensor([last_done], dtype=torch.long, device=device))
    seen = sorted({int(t.item()) for t in steps})
    if len(seen) != 1:
        print(
            f"train_ddp: ranks disagree on the resume step {seen}: is {args.checkpoint_dir} "
            "shared by every rank?",
            file=sys.stderr,
            flush=True,
        )
        dist.destroy_process_group()
        return 3

    if last_done >= args.steps and rank == 0:  # a rerun of a job that already finished
        print(f"nothing to train: the checkpoint in {args.checkpoint_dir} is at step {last_done} "
              f"of --steps {args.steps}; delete it (or pass another --checkpoint-dir) to train "
              "again, or raise --steps to train on", flush=True)

    ddp = DistributedDataParallel(model, device_ids=[local_rank] if backend == "nccl" else None)
    loss_fn = nn.MSELoss()
    loss_value = float("nan")
    first_step_reported = timing_printed = False
    first_step_time = 0.0
    for step in range(last_done + 1, args.steps + 1):
        if step == args.fail_at_step and rank == args.fail_rank and restart_count == 0:
            print(f"rank {rank}: injected failure at step {step}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)  # a crash: no cleanup, no goodbye to the peers
        x, y = batch(args.seed, step, rank)
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        if not first_step_reported:
            first_step_time = time.time()
            first_step_reported = True
        if TIMING and not timing_printed:
            timing_printed = True
            shown_restart = env_int("AEGIS_RESTART_COUNT", env_int("TORCHELASTIC_RESTART_COUNT", 0))
            # one write, so the two lines stay together even in a shared pipe (torchrun)
            print(
                f"AEGIS_FIRST_STEP {first_step_time:.6f}\n"
                f"AEGIS_FIRST_STEP_INFO rank {rank} restart {shown_restart} pid {os.getpid()} "
                f"at {first_step_time:.6f}\n"
                f"AEGIS_INIT rank {rank} restart {shown_restart} seconds {init_seconds:.4f}",
                flush=True,
            )
        report_progress(step)
        if step % args.checkpoint_every == 0 or step == args.steps:
            loss_value = float(loss.item())
        if step % args.checkpoint_every == 0:
            if rank == 0:
                print(f"step {step} loss {loss_value:.6f}", flush=True)
            dist.barrier()
            if rank == 0:
                if args.keep > 1:
                    save_kept(ckpt_path.parent, step, model, opt, args.keep)
                save_checkpoint(ckpt_path, step, model, opt)
        elif rank == 0 and _requested is not None and (run_id := _requested()):
            # asked for before a slow rank is evicted: save now, not at the next period (the
            # replicas are equal after opt.step(), so rank 0 saves alone, without a barrier)
            print(f"step {step}: checkpoint round {run_id}", flush=True)
            if args.keep > 1:
                save_kept(ckpt_path.parent, step, model, opt, args.keep)
            save_checkpoint(ckpt_path, step, model, opt)
        if args.step_time > 0:
            time.sleep(args.step_time)

    steps_run = max(0, args.steps - last_done)
    elapsed = time.time() - first_step_time if steps_run >= 2 else 0.0
    rate = (steps_run - 1) / elapsed if elapsed > 0 else float("nan")
    if TIMING:
        print(f"AEGIS_RATE {rate:.3f}", flush=True)

    final_step = max(last_done, args.steps)
    if rank == 0:
        print(
            f"done: final step {final_step}, loss {loss_value:.6f}, "
            f"params checksum {checksum(model):.17g}",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
