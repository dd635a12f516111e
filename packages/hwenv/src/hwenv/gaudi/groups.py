"""Intel's supported partial-server Gaudi groups for distributed workloads (G8, INTEL.md S9, S13).

The group rule is about a *distributed* workload (2 or more processes, one card each) on part
of a server. A single card is a standard run (Intel's own instructions start containers with
one card, `HABANA_VISIBLE_DEVICES=4`; Kubernetes pods ask for `habana.ai/gaudi: 1`), so a
one-card group always passes.
"""

from __future__ import annotations

from ..errors import GaudiGroupError

SERVER_SIZE = 8

#: Intel's supported module-ID groups for a distributed workload on part of an 8-device
#: server. Source: Intel Gaudi documentation, "Multiple Workloads on a Single Docker"
#: (the "multiple dockers, each with a single workload" table), as recorded in FACTS.md G8.
#: The order inside a group is free (Intel's example mounts HABANA_VISIBLE_MODULES=5,4,7,6).
SUPPORTED_PARTIAL_GROUPS: dict[int, tuple[frozenset[int], ...]] = {
    2: (frozenset({0, 1}), frozenset({2, 3}), frozenset({4, 5}), frozenset({6, 7})),
    4: (frozenset({0, 1, 2, 3}), frozenset({4, 5, 6, 7})),
}


def check_group(module_ids: tuple[int, ...], server_size: int = SERVER_SIZE) -> None:
    """Raise `GaudiGroupError` unless `module_ids` is one card, the full server or a supported 2/4 group (G8).

    Only a multi-card group is checked against Intel's table: one card (or none) passes.
    """
    group = frozenset(module_ids)
    bad = sorted(m for m in group if m >= server_size)
    if bad:
        raise GaudiGroupError(
            f"Gaudi module ID(s) {bad} do not exist on a {server_size}-device server (IDs 0..{server_size - 1}). "
            f"Use module IDs 0..{server_size - 1} (hl-smi -Q index,module_id -f csv lists them)."
        )
    if len(group) <= 1 or len(group) == server_size:
        return
    allowed = SUPPORTED_PARTIAL_GROUPS.get(len(group))
    if allowed is None:
        raise GaudiGroupError(
            f"A group of {len(group)} Gaudi devices {sorted(group)} is not supported for a distributed run on part "
            f"of a server: Intel supports groups of 2 or 4 devices (or all {server_size}, or a single card). "
            f"{supported_groups_text()} Use one of those groups, one card, or all {server_size}."
        )
    if group not in allowed:
        raise GaudiGroupError(
            f"Gaudi module IDs {sorted(group)} are not a supported {len(group)}-device group for a distributed run "
            f"on part of a server. {supported_groups_text()} Use one of those groups, one card, or all {server_size}."
        )


def supported_groups_text() -> str:
    """The supported partial-server groups, as one readable sentence."""
    parts = []
    for size, groups in SUPPORTED_PARTIAL_GROUPS.items():
        listed = " or ".join("{" + ",".join(str(m) for m in sorted(g)) + "}" for g in groups)
        parts.append(f"{size} devices: {listed}")
    return "Supported module-ID groups: " + "; ".join(parts) + " (order inside a group is free)."
