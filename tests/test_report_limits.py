"""Every repeated field and string of a report has a bound, and past it the report is refused
naming the field (issue 25).

The cases are generated from the protobuf descriptors of everything a `ReportRequest` can hold,
so a field added to the proto without a bound in `gputopo.bounds.REPORT_LIMITS` fails here (and
is refused at run time). Each case builds a report that reaches the field, sets it at ten times
its bound, and expects the refusal to name it.
"""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.server import Aggregator, AggregatorConfig
from gputopo.bounds import REPORT_LIMITS
from gputopo.codec import CodecError, check_limits, topology_to_proto
from gputopo.v1 import reporter_pb2 as rpb
from gputopo.v1 import reporter_pb2_grpc as rgrpc
from tests.aggregator.kubeutil import run
from tests.builders import nvswitch_node

ROOT = rpb.ReportRequest.DESCRIPTOR
_STRING = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES)


def _fields() -> list[tuple[FieldDescriptor, list[FieldDescriptor]]]:
    """Every field reachable from ReportRequest, with the message fields that lead to it."""
    out = []
    seen = {ROOT.full_name}
    queue: deque[tuple[Descriptor, list[FieldDescriptor]]] = deque([(ROOT, [])])
    while queue:
        desc, route = queue.popleft()
        for field in desc.fields:
            out.append((field, route))
            if (
                field.type == FieldDescriptor.TYPE_MESSAGE
                and field.message_type.full_name not in seen
            ):
                seen.add(field.message_type.full_name)
                queue.append((field.message_type, [*route, field]))
    return out


FIELDS = _fields()
NEEDS_BOUND = [(f, route) for f, route in FIELDS if f.is_repeated or f.type in _STRING]
BOUNDED_INTEGERS = [
    (f, route)
    for f, route in FIELDS
    if not f.is_repeated and f.full_name in REPORT_LIMITS and REPORT_LIMITS[f.full_name].value
]


def _reach(route: list[FieldDescriptor]) -> tuple[Message, Message, str]:
    """(a report, the message of it that holds the field, that message's path)."""
    report = rpb.ReportRequest(node_name="n1", incarnation=1, sequence=1)
    msg: Message = report
    path = ""
    for step in route:
        if step.is_repeated:
            msg = getattr(msg, step.name).add()
            path = f"{path}.{step.name}[0]" if path else f"{step.name}[0]"
        else:
            msg = getattr(msg, step.name)
            msg.SetInParent()
            path = f"{path}.{step.name}" if path else step.name
    return report, msg, path


@pytest.mark.parametrize(("field", "route"), NEEDS_BOUND, ids=[f.full_name for f, _ in NEEDS_BOUND])
def test_a_field_at_ten_times_its_bound_is_refused_by_name(
    field: FieldDescriptor, route: list[FieldDescriptor]
) -> None:
    limit = REPORT_LIMITS.get(field.full_name)
    assert limit is not None, f"{field.full_name} has no bound in gputopo.bounds.REPORT_LIMITS"
    report, holder, path = _reach(route)
    where = f"{path}.{field.name}" if path else field.name
    if field.is_repeated:
        assert limit.items > 0, field.full_name
        values = getattr(holder, field.name)
        for _ in range(10 * limit.items):
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                values.add()
            elif field.type in _STRING:
                values.append("x")
            else:
                values.append(0)
        want = f"{where}: {10 * limit.items} items"
    else:
        assert limit.chars > 0, field.full_name
        setattr(holder, field.name, "x" * (10 * limit.chars))
        want = f"{where}: {10 * limit.chars} characters"
    with pytest.raises(CodecError) as caught:
        check_limits(report)
    assert str(caught.value).startswith(want), (str(caught.value), want)


@pytest.mark.parametrize(
    ("field", "route"), BOUNDED_INTEGERS, ids=[f.full_name for f, _ in BOUNDED_INTEGERS]
)
def test_an_integer_past_what_hardware_has_is_refused_by_name(
    field: FieldDescriptor, route: list[FieldDescriptor]
) -> None:
    report, holder, path = _reach(route)
    setattr(holder, field.name, 2**32 - 1)  # the issue's value: a uint32's largest
    with pytest.raises(CodecError) as caught:
        check_limits(report)
    assert caught.value.field == f"{path}.{field.name}"


def test_a_real_report_is_within_every_bound() -> None:
    msg = rpb.ReportRequest(
        node_name="n1",
        incarnation=1,
        sequence=1,
        snapshot=rpb.Snapshot(topology=topology_to_proto(nvswitch_node("n1", gpus=8, nics=8))),
    )
    check_limits(msg)


def test_the_readme_lists_every_bound() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([A-Za-z_.]+)` \|", readme, flags=re.MULTILINE))
    missing = sorted(
        name.removeprefix("gputopo.v1.")
        for name in REPORT_LIMITS
        if name.removeprefix("gputopo.v1.") not in listed
    )
    assert not missing, f"README's table of report bounds lacks {missing}"


def test_over_grpc_a_report_past_a_bound_ends_invalid_argument_naming_it() -> None:
    topo = topology_to_proto(nvswitch_node("n1", gpus=4))
    topo.numa_nodes.add(id=0, distances=[10] * 2_560)
    msg = rpb.ReportRequest(
        node_name="n1", incarnation=1, sequence=1, snapshot=rpb.Snapshot(topology=topo)
    )

    async def go() -> None:
        agg = Aggregator(AggregatorConfig())
        await agg.start()
        try:
            async with grpc.aio.insecure_channel(agg.grpc_target) as channel:
                call = rgrpc.ReporterStub(channel).Report()
                await call.write(msg)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call.read()
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert (caught.value.details() or "").startswith(
                    "snapshot.topology.numa_nodes[0].distances: 2"
                )
                assert agg.state.record("n1") is None  # nothing applied
        finally:
            await agg.stop(grace_s=0.1)

    run(go(), timeout_s=60)


def test_the_exporter_cuts_an_overlong_string_to_its_bound_instead_of_losing_the_report() -> None:
    from gputopo.codec import clip_texts

    topo = topology_to_proto(nvswitch_node("n1", gpus=2))
    topo.nvml.reason = "NVML: " + "x" * 5_000
    topo.problems.append("y" * 3_000)
    msg = rpb.ReportRequest(
        node_name="n1", incarnation=1, sequence=1, snapshot=rpb.Snapshot(topology=topo)
    )
    assert clip_texts(msg) == 2
    check_limits(msg)
    assert msg.snapshot.topology.nvml.reason.startswith("NVML: x")


def _holder(report: Message, route: list[FieldDescriptor]) -> Message:
    """The message of `report` that holds a field reached by `route`, made where missing (the
    first item of each repeated step, so several fields can land in one message)."""
    msg = report
    for step in route:
        if step.is_repeated:
            items = getattr(msg, step.name)
            msg = items[0] if len(items) else items.add()
        else:
            msg = getattr(msg, step.name)
            msg.SetInParent()
    return msg


def _set_near_bound(holder: Message, field: FieldDescriptor, over: bool, item_over: bool) -> None:
    """Set `field` at its bound, or one past it (`over`: the count or the singular value;
    `item_over`: one string or integer item of a repeated field)."""
    limit = REPORT_LIMITS[field.full_name]
    if field.is_repeated:
        values = getattr(holder, field.name)
        del values[:]
        for _ in range(limit.items + over):
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                values.add()
            elif field.type in _STRING:
                values.append("x" * limit.chars)
            else:
                values.append(limit.value)
        if item_over and field.type in _STRING:
            values[-1] = "x" * (limit.chars + 1)
        elif item_over and limit.value:
            values[-1] = limit.value + 1
    elif field.type in _STRING:
        setattr(holder, field.name, "x" * (limit.chars + over))
    else:
        setattr(holder, field.name, limit.value + over)


SETTABLE = [
    (f, route)
    for f, route in FIELDS
    if f.full_name in REPORT_LIMITS and (f.is_repeated or f.type in _STRING)
] + BOUNDED_INTEGERS


def _both_walks(report: Message) -> tuple[bool, CodecError | None]:
    """(what the fast walk says, what the walk with paths raises) of `report`."""
    from gputopo.codec.limits import _check, _fits

    fits = _fits(report)
    try:
        _check(report, "")
    except CodecError as err:
        return fits, err
    return fits, None


def _assert_walks_agree(report: Message) -> None:
    fits, named = _both_walks(report)
    assert fits == (named is None), (fits, named)
    if named is not None:
        with pytest.raises(CodecError) as caught:
            check_limits(report)
        assert str(caught.value) == str(named)  # the field named, not "report: past a bound"


VARIANTS = [(False, False), (True, False), (False, True)]  # at the bound, count past, item past


def test_for_every_bounded_field_the_fast_walk_and_the_walk_with_paths_agree() -> None:
    """`check_limits` walks a report without paths first and again with them only when that
    walk fails: each field at its bound, one past it, and one item past it, alone in a report,
    gets the same answer from both (a report the fast walk lets through unchecked, or one
    refused without its field named, would be a bug)."""
    for field, route in SETTABLE:
        for over, item_over in VARIANTS:
            report = rpb.ReportRequest(node_name="n1", incarnation=1, sequence=1)
            _set_near_bound(_holder(report, route), field, over, item_over)
            try:
                _assert_walks_agree(report)
            except AssertionError as err:
                raise AssertionError(
                    f"{field.full_name} over={over} item_over={item_over}"
                ) from err


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(range(len(SETTABLE))),
            st.sampled_from([False, False, True]),  # mostly at the bound: some reports fit
            st.sampled_from([False, False, True]),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_with_several_fields_near_their_bounds_both_walks_agree(
    picks: list[tuple[int, bool, bool]],
) -> None:
    """As above, with several fields of one report at or past their bounds together."""
    report = rpb.ReportRequest(node_name="n1", incarnation=1, sequence=1)
    for index, over, item_over in picks:
        field, route = SETTABLE[index]
        _set_near_bound(_holder(report, route), field, over, item_over)
    _assert_walks_agree(report)
