"""The log classifier: realistic output per cause, which match wins, and user-extended tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from aegis_flow.steps.classify import (
    CAUSE_CLASSES,
    CauseTableError,
    classify,
    default_table,
    load_table,
)

TRACE = ["Traceback (most recent call last):", '  File "train.py", line 42, in <module>',
         "    loss.backward()"]

EXAMPLES = {
    "nccl_timeout": "[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective "
                    "operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, "
                    "NumelOut=1, Timeout(ms)=600000) ran for 600013 milliseconds before timing "
                    "out.",
    "nccl_error": "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
                  "c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with "
                  "NCCL_DEBUG=INFO for details), NCCL version 2.19.3",
    "cuda_error": "RuntimeError: CUDA error: unspecified launch failure",
    "ecc_error": "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    "oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
           "total capacity of 79.15 GiB of which 1.02 GiB is free.",
    "socket_timeout": "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:"
                      "81] Timed out waiting 1800000ms for recv operation to complete",
    "connection_reset": "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                        "Read error [127.0.0.1]:41234: Connection reset by peer",
    "segfault": "Fatal Python error: Segmentation fault",
    "illegal_memory_access": "RuntimeError: CUDA error: an illegal memory access was "
                             "encountered",
    "import_error": "ModuleNotFoundError: No module named 'flash_attn'",
    "file_not_found": "FileNotFoundError: [Errno 2] No such file or directory: "
                      "'/data/shard-0001.bin'",
    "gpu_lost": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
}

MORE = [
    ("oom", "RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not "
            "enough memory: you tried to allocate 1073741824000 bytes."),
    ("oom", "[12345.678] Out of memory: Killed process 4242 (python) total-vm:81234567kB"),
    ("oom", "RuntimeError: CUDA error: out of memory"),
    ("ecc_error", "NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, An uncorrectable double bit error"),
    ("nccl_error", "torch.distributed.DistBackendError: [2] is setting up NCCL communicator and "
                   "retrieving ncclUniqueId from [0] via c10d key-value store: ncclRemoteError"),
    ("socket_timeout", "torch.distributed.DistStoreError: Timed out after 901 seconds waiting "
                       "for clients. 1/2 clients joined."),
    ("connection_reset", "ConnectionResetError: [Errno 104] Connection reset by peer"),
    ("segfault", "Segmentation fault (core dumped)"),
    ("segfault", "ERROR: Unexpected bus error encountered in worker. This might be caused by "
                 "insufficient shared memory (shm)."),
    ("import_error", "ImportError: libcudart.so.12: cannot open shared object file: No such file "
                     "or directory"),
    ("cuda_error", "RuntimeError: CUDA driver version is insufficient for CUDA runtime version"),
]


@pytest.mark.parametrize("code", sorted(EXAMPLES))
def test_each_cause_from_a_realistic_message(code: str) -> None:
    cause = classify([*TRACE, EXAMPLES[code], "exiting"])
    assert cause.code == code
    assert cause.line == EXAMPLES[code] and cause.line_no == len(TRACE)
    assert cause.klass in CAUSE_CLASSES and cause.description


@pytest.mark.parametrize(("code", "line"), MORE, ids=[f"{c}-{i}" for i, (c, _) in
                                                       enumerate(MORE)])
def test_more_variants(code: str, line: str) -> None:
    assert classify([line]).code == code


def test_classes_of_the_default_table() -> None:
    classes = {r.code: r.klass for r in default_table().rules}
    assert classes["ecc_error"] == "hardware" and classes["gpu_lost"] == "hardware"
    assert classes["import_error"] == "container" and classes["oom"] == "user"
    assert all(classes[c] == "transient" for c in
               ("nccl_timeout", "nccl_error", "socket_timeout", "connection_reset"))


def test_no_match_is_unknown() -> None:
    cause = classify(["epoch 3 loss 0.12", "Killed"])
    assert (cause.code, cause.klass, cause.line, cause.known) == ("unknown", "transient", None,
                                                                   False)
    assert classify([]).code == "unknown"


def test_highest_priority_wins_over_later_lines() -> None:
    lines = [EXAMPLES["ecc_error"], EXAMPLES["connection_reset"], EXAMPLES["cuda_error"]]
    assert classify(lines).code == "ecc_error"
    # a NCCL timeout, then the process group tearing down: the timeout is the cause
    assert classify([EXAMPLES["nccl_timeout"], EXAMPLES["connection_reset"]]).code == (
        "nccl_timeout")


def test_among_equal_priorities_the_last_line_wins() -> None:
    first, last = "FileNotFoundError: a.bin", "FileNotFoundError: b.bin"
    assert classify([first, "noise", last]).line == last


def test_a_user_file_extends_and_overrides(tmp_path: Path) -> None:
    user = tmp_path / "causes.toml"
    user.write_text("""
[[rule]]
code = "dataloader_stall"
class = "transient"
priority = 75
patterns = ['''DataLoader worker \\(pid\\(s\\) [\\d, ]+\\) exited unexpectedly''']
description = "a DataLoader worker died"

[[rule]]
code = "oom"
class = "hardware"
priority = 85
patterns = ['''CUDA out of memory''']
""")
    table = load_table(user)
    line = "RuntimeError: DataLoader worker (pid(s) 123, 456) exited unexpectedly"
    cause = classify(["x", line], table)
    assert (cause.code, cause.klass) == ("dataloader_stall", "transient")
    assert classify([EXAMPLES["oom"]], table).klass == "hardware"  # overridden
    assert classify([MORE[0][1]], table).code == "unknown"  # the override replaced the patterns
    assert classify([EXAMPLES["segfault"]], table).code == "segfault"  # defaults kept
    assert classify([line]).code == "unknown"  # the default table is untouched


def test_replace_defaults(tmp_path: Path) -> None:
    user = tmp_path / "only.toml"
    user.write_text("replace_defaults = true\n[[rule]]\ncode = 'mine'\nclass = 'user'\n"
                    "patterns = ['boom']\n")
    table = load_table(user)
    assert [r.code for r in table.rules] == ["mine"]
    assert classify([EXAMPLES["segfault"], "boom"], table).code == "mine"


@pytest.mark.parametrize(("text", "message"), [
    ("[[rule]]\ncode = 'Bad Name'\nclass = 'user'\npatterns = ['x']", "lower_snake_case"),
    ("[[rule]]\ncode = 'a'\nclass = 'software'\npatterns = ['x']", "'class' must be one of"),
    ("[[rule]]\ncode = 'a'\nclass = 'user'\npatterns = []", "non-empty list"),
    ("[[rule]]\ncode = 'a'\nclass = 'user'\npatterns = ['(']", "bad regex"),
    ("[[rule]]\ncode = 'a'\nclass = 'user'\npriority = 'high'\npatterns = ['x']", "integer"),
    ("[[rule]\n", "not valid TOML"),
])
def test_bad_tables_are_rejected_with_a_clear_message(tmp_path: Path, text: str,
                                                       message: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(CauseTableError, match=message):
        load_table(bad)
    with pytest.raises(CauseTableError, match="cannot read"):
        load_table(tmp_path / "missing.toml")


def test_live_rules_are_the_fatal_ones_and_a_line_is_live_only_as_its_own_class() -> None:
    """The live trigger's question: is this line, classified as a whole, a live rule?"""
    from aegis_flow.steps.classify import CauseTableError, load_table, parse_table

    table = load_table()
    live = {r.code for r in table.rules if r.live}
    assert live == {"ecc_error", "gpu_lost", "illegal_memory_access", "nccl_timeout",
                    "nccl_error", "cuda_error"}
    hit = table.match_live("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)")
    assert hit is not None and hit.code == "nccl_timeout"
    # an OOM is not live (scripts catch it and go on), even in the words of a CUDA error
    assert table.match_live("RuntimeError: CUDA error: out of memory") is None
    assert table.match_live("step 10 loss 0.5") is None
    with pytest.raises(CauseTableError, match="'live' must be true or false"):
        parse_table('[[rule]]\ncode = "x"\nclass = "user"\nlive = 1\npatterns = ["x"]\n')
