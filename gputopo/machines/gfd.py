"""The labels NVIDIA's GPU Feature Discovery (GFD) would put on a node with this topology.

Why: users select GPU nodes by GFD's labels (`node_selector: {nvidia.com/gpu.product:
NVIDIA-GB200}`), and on a real cluster GFD has written them on every GPU node. A simulated or
inventory node has no GFD, so without these a selector that works on the real cluster matches
nothing offline. Only the labels that follow from the topology are made, exactly as GFD spells
them (k8s-device-plugin `internal/lm`): the product with spaces as `-`, the GPU count, the memory
of one GPU in MiB, and the NVLink clique `<ClusterUUID>.<CliqueID>`, which GFD emits only when
every GPU is fabric-attached to the same clique.
"""

from __future__ import annotations

from gputopo.topology import NodeTopology

__all__ = ["GFD_CLIQUE", "GFD_COUNT", "GFD_MEMORY", "GFD_PRODUCT", "gfd_labels"]

GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_COUNT = "nvidia.com/gpu.count"
GFD_MEMORY = "nvidia.com/gpu.memory"
GFD_CLIQUE = "nvidia.com/gpu.clique"


def gfd_labels(topology: NodeTopology) -> dict[str, str]:
    """GFD's product, count, memory and clique labels for the node; {} for a node without GPUs.

    A label whose fact is unknown (no product name, no memory size, GPUs of two products or
    cliques) is left out, as GFD leaves out what it cannot read.
    """
    gpus = topology.gpus
    if not gpus:
        return {}
    labels = {GFD_COUNT: str(len(gpus))}
    products = {g.name for g in gpus}
    if len(products) == 1 and (product := products.pop()):
        labels[GFD_PRODUCT] = product.strip().replace(" ", "-")
    memory = {g.memory_mib for g in gpus}
    if len(memory) == 1 and (mib := memory.pop()) > 0:
        labels[GFD_MEMORY] = str(mib)
    cliques = {g.fabric.clique if g.fabric and g.fabric.usable else "" for g in gpus}
    if len(cliques) == 1 and (clique := cliques.pop()):
        labels[GFD_CLIQUE] = clique
    return labels
