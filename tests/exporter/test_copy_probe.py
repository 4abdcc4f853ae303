"""The copy probe over a fake CUDA runtime that answers as cuda-bindings does on a real H100.

The figures come from the H100 VM recordings (`tests/data/torch_copy_bandwidth_h100_vm.json`,
`nvbandwidth_h100_vm_256mib.txt`): the probe must land within 5 % of them, as it did there.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from exporter.fake_cuda import CudaErrorT, FakeCudaRuntime, FakeGpu
from exporter.probes.gpu import CudaCopyProbe, CudaError, Rates
from exporter.probes.gpu_worker import serve
from gputopo.topology import Measurement

DATA = Path(__file__).parent.parent / "data"
VM_BUS = "0000:00:06.0"


def _recorded_h2d_gbps() -> float:
    text = (DATA / "torch_copy_bandwidth_h100_vm.json").read_text().split("\n", 1)[1]
    return float(json.loads(text)["h2d_x1"]["median"])


def _probe(runtime: FakeCudaRuntime, **options: object) -> CudaCopyProbe:
    return CudaCopyProbe(
        runtime=runtime,
        monotonic=runtime.now,
        sleep=runtime.sleep,
        clock=runtime.now,
        **options,  # type: ignore[arg-type]
    )


def _cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def test_the_fake_returns_the_bus_id_padded_as_the_binding_does() -> None:
    err, raw = FakeCudaRuntime([FakeGpu(VM_BUS)]).cudaDeviceGetPCIBusId(32, 0)
    assert err is CudaErrorT.cudaSuccess
    assert raw == b"0000:00:06.0\x00" + b" " * 19  # as recorded on the H100 VM


def test_a_padded_bus_id_still_finds_the_gpu() -> None:
    """Regression: `rstrip("\\x00")` kept the NUL before the padding, so every probe failed
    with "CUDA does not see the GPU"."""
    probe = _probe(FakeCudaRuntime([FakeGpu(VM_BUS, host_gbps=_recorded_h2d_gbps())]))
    assert probe.available() == (True, "")
    measured = probe.host(VM_BUS, cpus=_cpus())
    assert measured.gbps == pytest.approx(_recorded_h2d_gbps(), rel=0.05)


def test_an_unknown_gpu_is_named() -> None:
    probe = _probe(FakeCudaRuntime([FakeGpu(VM_BUS)]))
    with pytest.raises(CudaError, match=r"does not see the GPU at 0000:00:07\.0"):
        probe.host("0000:00:07.0", cpus=_cpus())


def test_a_slow_stretch_of_several_hundred_ms_does_not_pass_for_the_link() -> None:
    """Every tool saw 25-43 GB/s for longer than one sample on that machine. With samples over
    1.5 s the stretch spoils a minority; the old three back-to-back samples all fell inside it."""
    full = _recorded_h2d_gbps()
    slow = [(0.05, 0.55, 0.5)]  # half speed for 500 ms, right after the warm-up
    runtime = FakeCudaRuntime([FakeGpu(VM_BUS, host_gbps=full)], slow=slow)
    measured = _probe(runtime).host(VM_BUS, cpus=_cpus())
    assert measured.gbps == pytest.approx(full, rel=0.05)
    assert measured.samples >= 11
    assert measured.low_gbps is not None
    assert measured.low_gbps < 0.8 * full  # the spread shows the stretch
    assert measured.duration_s >= 3.0  # both directions, 1.5 s each at least

    hasty = _probe(
        FakeCudaRuntime([FakeGpu(VM_BUS, host_gbps=full)], slow=slow),
        min_samples=3,
        min_duration_s=0.0,
        gap_s=0.0,
    )
    assert hasty.host(VM_BUS, cpus=_cpus()).gbps < 0.6 * full  # what the old probe reported


def test_peer_copies_use_the_peer_link_and_the_slower_direction() -> None:
    gpus = [FakeGpu("0000:18:00.0", peers={1: 390.0}), FakeGpu("0000:2a:00.0", peers={0: 370.0})]
    measured = _probe(FakeCudaRuntime(gpus)).peer("0000:18:00.0", "0000:2a:00.0")
    assert measured.gbps == pytest.approx(370.0, rel=0.01)
    assert measured.latency_us is not None


def test_without_peer_access_the_copy_is_staged_through_the_host() -> None:
    gpus = [FakeGpu("0000:18:00.0"), FakeGpu("0000:2a:00.0")]
    measured = _probe(FakeCudaRuntime(gpus)).peer("0000:18:00.0", "0000:2a:00.0")
    assert measured.gbps == pytest.approx(54.6 / 2, rel=0.01)


def test_the_fake_refuses_an_int_where_the_binding_wants_its_enum() -> None:
    runtime = FakeCudaRuntime([FakeGpu(VM_BUS)])
    _, stream = runtime.cudaStreamCreateWithFlags(runtime.cudaStreamNonBlocking)
    _, dst = runtime.cudaMalloc(1024)
    _, src = runtime.cudaHostAlloc(1024, runtime.cudaHostAllocDefault)
    with pytest.raises(TypeError, match="cudaMemcpyKind"):
        runtime.cudaMemcpyAsync(dst, src, 1024, 1, stream)


def test_no_gpu_says_why() -> None:
    ok, why = _probe(FakeCudaRuntime([])).available()
    assert not ok
    assert "cudaErrorNoDevice" in why


@pytest.mark.parametrize(
    ("rates", "want"),
    [
        pytest.param([10.0], Rates(10.0, 10.0, 10.0, 1), id="one sample is its own spread"),
        pytest.param(
            [50.0, 55.0, 54.0, 27.0, 55.0, 54.5, 55.0, 54.8, 54.9, 55.1, 30.0],
            Rates(54.8, 30.0, 55.0, 11),
            id="two slow samples of eleven move the low decile, not the median",
        ),
    ],
)
def test_rates_are_the_median_and_deciles(rates: list[float], want: Rates) -> None:
    got = Rates.of(rates)
    assert got.median == pytest.approx(want.median)
    assert got.low == pytest.approx(want.low)
    assert got.high == pytest.approx(want.high)
    assert got.samples == want.samples


def test_the_worker_protocol_carries_the_spread_back_to_a_measurement() -> None:
    """What `gpu_worker` prints is what `WorkerGpuProbe` rebuilds: median, spread, samples."""
    runtime = FakeCudaRuntime([FakeGpu(VM_BUS)])
    tasks = io.StringIO(json.dumps({"op": "host", "bus": VM_BUS, "cpus": _cpus()}) + "\n")
    out = io.StringIO()
    serve(_probe(runtime), tasks, out)
    ready, answer = (json.loads(line) for line in out.getvalue().splitlines())
    assert ready == {"ready": True}
    measured = Measurement(**answer["measurement"])
    assert measured.samples >= 11
    assert measured.low_gbps is not None
    assert measured.high_gbps is not None
    assert measured.low_gbps <= measured.gbps <= measured.high_gbps


def test_the_fake_refuses_a_float_size_as_the_binding_does() -> None:
    runtime = FakeCudaRuntime([FakeGpu(VM_BUS)])
    _, stream = runtime.cudaStreamCreateWithFlags(runtime.cudaStreamNonBlocking)
    _, dst = runtime.cudaMalloc(1024)
    _, src = runtime.cudaHostAlloc(1024, runtime.cudaHostAllocDefault)
    kind = runtime.cudaMemcpyKind.cudaMemcpyHostToDevice
    with pytest.raises(TypeError, match="count"):
        runtime.cudaMemcpyAsync(dst, src, 1024.0, kind, stream)  # type: ignore[arg-type]
