"""The cost model's arithmetic (``tests/support/cost_model.py``, fitted by
``bench/bench_model.py``): its terms, the max of the transfer terms, and that the fit recovers
coefficients from runs the model itself generated. No timing."""

from __future__ import annotations

import math

import pytest

from tests.support import cost_model as cm

MIB = cm.MIB


def coefficients() -> cm.Coefficients:
    return cm.Coefficients(
        time={"verify": {"start": 2.0, "per_leaf": 0.01, "cpu_per_byte": 10e-3 / MIB}},
        shared={"startup": 3.0, "window_1": 8.0, "window_w": 4.0, "store_per_byte": 20e-3 / MIB},
        memory={
            "verify": {
                "base": 100 * MIB,
                "per_chunk_byte": 3.0,
                "per_byte": 0.5,
                "per_leaf": 1024.0,
            }
        },
    )


def test_local_time_is_start_leaves_and_cpu() -> None:
    s = cm.Setting("verify", nbytes=100 * MIB, chunk=4 * MIB, leaves=10)
    # 2 s + 10 x 0.01 s + 100 MiB x 10 ms/MiB; no worker start-up with one process.
    assert cm.predict_time(s, coefficients()) == pytest.approx(2.0 + 0.1 + 1.0)


def test_the_slowest_transfer_term_sets_the_pace() -> None:
    c = coefficients()
    capped = cm.Setting("verify", 100 * MIB, 4 * MIB, 10, workers=4, requests=80,
                        latency=0.025, bandwidth=5 * MIB, net_bytes=100 * MIB)  # fmt: skip
    terms = cm.time_terms(capped, c)
    assert terms["bandwidth"] == pytest.approx(5.0)  # 100 MiB / (4 x 5 MiB/s)
    assert terms["latency"] == pytest.approx(80 * 0.025 / (4 * 4.0))  # the worker's window
    assert terms["startup"] == pytest.approx(3.0 * 4 / 2)
    assert cm.predict_time(capped, c) == pytest.approx(2.0 + 0.1 + 6.0 + 5.0)
    # A store on these cores charges its CPU per byte on top; a real store does not.
    here = cm.Setting("verify", 100 * MIB, 4 * MIB, 10, net_bytes=100 * MIB, local_store=True)
    assert cm.time_terms(here, c)["store"] == pytest.approx(2.0)
    assert cm.time_terms(capped, c)["store"] == 0.0
    chatty = cm.Setting("verify", 100 * MIB, 4 * MIB, 10, requests=8000, latency=0.025)
    assert cm.predict_time(chatty, c) == pytest.approx(2.1 + 8000 * 0.025 / 8.0)


def test_memory_holds_chunks_and_data_up_to_the_budget() -> None:
    c = coefficients()
    small = cm.Setting("verify", 8 * MIB, 4 * MIB, 10)
    huge = cm.Setting("verify", 8 * MIB, 1024 * MIB, 10, budget=64 * MIB)
    # 100 MiB + (3 x 4 MiB + 0.5 x 8 MiB) + 10 KiB; the budget caps what is held.
    assert cm.predict_memory(small, c) == pytest.approx(100 * MIB + 16 * MIB + 10 * 1024)
    assert cm.predict_memory(huge, c) == pytest.approx(100 * MIB + 64 * MIB + 10 * 1024)
    # A worker holds its unit, not the checkpoint.
    worker = cm.Setting("verify", 8 << 30, 4 * MIB, 10, workers=4, unit=64 * MIB)
    assert worker.held == 64 * MIB
    assert cm.predict_memory(worker, c) == pytest.approx(100 * MIB + 44 * MIB + 10 * 1024)


def test_the_fit_recovers_the_coefficients_it_was_given() -> None:
    truth = coefficients()
    settings = [
        cm.Setting(
            "verify",
            mib * MIB,
            4 * MIB,
            leaves,
            workers=w,
            requests=r,
            latency=lat,
            bandwidth=bw,
            net_bytes=mib * MIB,
            local_store=bw is not None,
        )
        for mib, leaves, w, r, lat, bw in [
            (64, 16, 1, 0, 0.0, None),
            (512, 16, 1, 0, 0.0, None),
            (64, 512, 1, 0, 0.0, None),
            (256, 16, 4, 0, 0.0, None),
            (64, 16, 1, 30, 0.025, 2 * MIB),
            (64, 16, 4, 30, 0.025, 2 * MIB),
            (64, 512, 1, 4000, 0.025, 64 * MIB),
            (64, 512, 4, 4000, 0.025, 64 * MIB),
        ]
    ]
    assert settings
    runs = [(s, cm.predict_time(s, truth)) for s in settings]
    fitted = cm.fit_time(runs, cm.Coefficients())
    for s, measured in runs:
        assert abs(cm.relative_error(cm.predict_time(s, fitted), measured)) < 0.02
    assert math.isclose(fitted.shared["window_1"], 8.0, rel_tol=0.05)
    assert math.isclose(fitted.time["verify"]["cpu_per_byte"] * MIB, 10e-3, rel_tol=0.05)
    sizes = [
        cm.Setting("verify", mib * MIB, chunk * MIB, leaves)
        for chunk in (1, 4, 32)
        for mib in (64, 512)
        for leaves in (16, 512)
    ]
    memory = cm.fit_memory([(s, cm.predict_memory(s, truth)) for s in sizes], fitted)
    assert memory.memory["verify"]["base"] == pytest.approx(100 * MIB, rel=0.05)
    assert memory.memory["verify"]["per_chunk_byte"] == pytest.approx(3.0, rel=0.05)
