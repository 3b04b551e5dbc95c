"""``rlguard.doctor``: offline diagnosis of training logs with the live guard's detectors, and run reports.

>>> from rlguard.doctor import diagnose
>>> diagnosis = diagnose("out/checkpoint-500/trainer_state.json")  # doctest: +SKIP
>>> [(f.severity, f.detector, f.step) for f in diagnosis.findings]  # doctest: +SKIP

Reads TRL, verl, flat JSONL, wandb CSV and TensorBoard logs (:mod:`rlguard.doctor.readers`), maps their keys onto
canonical names (:mod:`rlguard.doctor.keys`) and replays them through ``Guard(GuardConfig.preset("monitor"))``.
Plots need matplotlib, imported only when a plot is drawn.
"""

from rlguard.doctor.diagnose import (
    EXIT_BAD_INPUT,
    EXIT_CANNOT_JUDGE,
    EXIT_CRITICAL,
    EXIT_INTERNAL,
    EXIT_OK,
    Diagnosis,
    DoctorFinding,
    diagnose,
)
from rlguard.doctor.keys import (
    KEY_TO_CANONICAL,
    KeyReport,
    canonical_stats,
    classify_keys,
    parse_key_map,
    suggest_canonical,
)
from rlguard.doctor.readers import FORMATS, LogInputError, MetricLog, ReadReport, find_log, read_log
from rlguard.doctor.report import ReportResult, write_report

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_CANNOT_JUDGE",
    "EXIT_CRITICAL",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "FORMATS",
    "KEY_TO_CANONICAL",
    "Diagnosis",
    "DoctorFinding",
    "KeyReport",
    "LogInputError",
    "MetricLog",
    "ReadReport",
    "ReportResult",
    "canonical_stats",
    "classify_keys",
    "diagnose",
    "find_log",
    "parse_key_map",
    "read_log",
    "suggest_canonical",
    "write_report",
]
