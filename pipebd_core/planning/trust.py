"""How far a profile can be trusted: what the planner's predictions stand on, said in plan.json, by
`pipebd plan` and on the job page.

A profile is `noisy` when some measurement's trials still disagree after the profiler took it again
(the measurement is named, with its spread), `busy` when other processes used a good part of the node
while it was measured (or shared a rank's GPU), `stale` when it is old. A profile that training has
calibrated (distill_calibration.py) says so, and from which run. `assess` judges a block profile (plan.json),
`assess_layers` a layer profile (finetune_plan.json: noisy and stale; a layer profile records no load).
"""

from __future__ import annotations

import time

from pipebd_core.documents.layer_profile import LayerProfile
from pipebd_core.documents.profile import Profile, Timing
from pipebd_core.documents.trust import NoisyMeasurement, ProfileTrust
from pipebd_core.profile.measure import NOISY_SPREAD

BUSY_CORES = 0.5  # other processes using more CPU than this (in cores) while profiling: a busy node
STALE_AFTER_S = 7 * 24 * 3600.0
LAYER_PARTS = ("F", "B", "I", "W", "optim", "I_kernel", "I_halves")  # a layer profile's timed parts


def noisy_measurements(profile: Profile) -> list[NoisyMeasurement]:
    """Every block and data-loading measurement whose trials disagree, widest first."""
    found = []
    for index, block in enumerate(profile.blocks):
        for what, table in block.timings():
            for batch, entry in table.items():
                if entry.trials and entry.spread > NOISY_SPREAD:
                    found.append(_noisy(f"block {index} {what}", index, batch, entry))
    for batch, entry in profile.data_s.items():
        if entry.trials and entry.spread > NOISY_SPREAD:
            found.append(_noisy("data loading", None, batch, entry))
    return sorted(found, key=lambda item: -item.spread)


def noisy_layer_measurements(profile: LayerProfile) -> list[NoisyMeasurement]:
    """Every layer part, send and all-reduce measurement whose trials disagree, widest first."""
    found = []
    for index, layer in enumerate(profile.layers):
        for batch_name, times in (("microbatch", layer.microbatch), ("shard", layer.shard)):
            batch = getattr(profile.batches, batch_name)
            for part in LAYER_PARTS:
                entry: Timing | None = getattr(times, part)
                if entry is not None and entry.trials and entry.spread > NOISY_SPREAD:
                    found.append(_noisy(f"layer {index} {part}", None, batch, entry))
    for elements, entry in profile.p2p_s.items():
        if entry.trials and entry.spread > NOISY_SPREAD:
            found.append(_noisy(f"send of {elements} elements", None, profile.batches.microbatch, entry))
    entry = profile.allreduce_s
    if entry.trials and entry.spread > NOISY_SPREAD:
        found.append(_noisy("all-reduce of the gradients", None, profile.batches.shard, entry))
    return sorted(found, key=lambda item: -item.spread)


def _noisy(what: str, block: int | None, batch: int, entry: Timing) -> NoisyMeasurement:
    return NoisyMeasurement(
        what=what, block=block, batch=batch, spread=round(entry.spread, 3), remeasured=entry.remeasured
    )


def assess(profile: Profile, now: float | None = None) -> ProfileTrust:
    """The trust report: flags (noisy, busy, stale; none: trusted), what each flag rests on, one message
    per flag, and the calibration the costs carry."""
    now = time.time() if now is None else now
    noisy = noisy_measurements(profile)
    conditions = profile.conditions
    others = conditions.other_cpu_cores if conditions else None
    gpu_others = [pid for pids in (conditions.gpu_other_processes if conditions else None) or [] for pid in pids]
    age = now - profile.measured_at if profile.measured_at is not None else None
    busy = None
    if (others is not None and others > BUSY_CORES) or gpu_others:
        gpu = f", other processes on the GPUs: {gpu_others}" if gpu_others else ""
        busy = f"busy: other processes used {others or 0:.2f} CPU cores while it was measured{gpu}"
    flags, messages = _flags(noisy, busy, age, "`pipebd profile --refresh`")
    if not conditions:
        messages.append("taken before profiles recorded their conditions: load unknown")
    calibration = profile.calibration
    if calibration:
        source = calibration.source
        messages.append(
            f"calibrated from run {source.run} (steps {source.steps[0]}-{source.steps[1]}): the"
            " planner uses the block times training measured"
        )
    return ProfileTrust(
        trusted=not flags,
        flags=flags,
        messages=messages,
        noisy=noisy,
        other_cpu_cores=others,
        age_s=age,
        calibrated_from=calibration.source if calibration else None,
    )


def assess_layers(profile: LayerProfile, now: float | None = None) -> ProfileTrust:
    """A layer profile's trust report: noisy and stale, as `assess` judges a block profile's."""
    now = time.time() if now is None else now
    noisy = noisy_layer_measurements(profile)
    age = now - profile.measured_at if profile.measured_at is not None else None
    flags, messages = _flags(noisy, None, age, "removing it from the profile cache (PIPEBD_CACHE_DIR)")
    return ProfileTrust(
        trusted=not flags,
        flags=flags,
        messages=messages,
        noisy=noisy,
        other_cpu_cores=None,
        age_s=age,
        calibrated_from=None,
    )


def _flags(
    noisy: list[NoisyMeasurement], busy: str | None, age_s: float | None, afresh: str
) -> tuple[list[str], list[str]]:
    """The flags a profile earns and one message each, in the report's order: noisy, busy, stale (`busy`:
    its message, None when the profile was not measured beside other work; `afresh`: how to re-measure)."""
    flags, messages = [], []
    if noisy:
        flags.append("noisy")
        messages.append(noisy_message(noisy))
    if busy:
        flags.append("busy")
        messages.append(busy)
    if age_s is not None and age_s > STALE_AFTER_S:
        flags.append("stale")
        messages.append(stale_message(age_s, afresh))
    return flags, messages


def noisy_message(noisy: list[NoisyMeasurement]) -> str:
    worst = ", ".join(f"{m.what} at batch {m.batch} spread {m.spread:.2f}" for m in noisy[:3])
    more = f" and {len(noisy) - 3} more" if len(noisy) > 3 else ""
    return f"noisy: {len(noisy)} measurements disagree after re-measuring ({worst}{more})"


def stale_message(age_s: float, afresh: str) -> str:
    return f"stale: measured {age_s / 86400:.0f} days ago; {afresh} measures afresh"
