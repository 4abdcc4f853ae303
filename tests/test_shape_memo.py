"""`node_shape` answers clones of one machine from their shared device tuples, and never
answers a node whose devices differ from a remembered one."""

from __future__ import annotations

import copy
from dataclasses import replace

from gputopo.links import LinkHealth
from gputopo.shape import node_shape
from tests.builders import nvswitch_node


def test_a_clone_sharing_the_device_tuples_gets_the_same_shape() -> None:
    template = nvswitch_node("template")
    clone = copy.copy(template)
    object.__setattr__(clone, "name", "clone")
    assert node_shape(clone) is node_shape(template)


def test_a_node_with_a_downed_gpu_is_not_mistaken_for_its_template() -> None:
    template = nvswitch_node("template")
    before = node_shape(template)
    gpus = (replace(template.gpus[0], health=LinkHealth.DOWN), *template.gpus[1:])
    changed = replace(template, gpus=gpus)
    assert node_shape(changed) is not before
    assert node_shape(changed).nvlink_gbps[0] == 0.0
    assert node_shape(template) is before


def test_equal_devices_in_new_tuples_still_share_one_interned_shape() -> None:
    a = nvswitch_node("a")
    b = nvswitch_node("b")  # built afresh: equal devices, other tuples
    assert a.links is not b.links
    assert node_shape(a) is node_shape(b)
