"""Outstanding tokens per routing target, with the least-loaded target at hand (docs/routing.md).

A router that wants the target with the fewest outstanding tokens (ties to the lowest target) must not scan
every target on every arrival: a 1,024-instance cluster would spend its time there. ``TargetLoads`` keeps a
segment tree over the targets whose every node holds the minimum of its leaves' ``load x targets + target``:
one int that orders by load first, then by target, so the root is the least-loaded target. A change of one
target's load updates its leaf and the nodes above it (``log2(targets)`` of them); the answer is the root.

The tree is the implicit one of ``2 x targets`` slots: leaf ``t`` at slot ``targets + t``, node ``i`` the
minimum of slots ``2i`` and ``2i + 1``; every slot in ``[2, 2 x targets)`` is the child of exactly one node in
``[1, targets)``, so slot 1 covers every leaf, whatever the number of targets::

    targets = 3:      [1] = min([2], [3])
                      [2] = min([4], [5])     leaves: [3] = t0, [4] = t1, [5] = t2
"""

from __future__ import annotations

from dsakv.errors import DsakvError


class TargetLoads:
    """The outstanding tokens of each of ``targets`` targets (all 0 at first); ``least_loaded()`` in O(1),
    ``add()`` in O(log targets)."""

    def __init__(self, targets: int) -> None:
        if not isinstance(targets, int) or targets < 1:
            raise DsakvError(f"targets = {targets!r}: must be an integer >= 1")
        self.targets = targets
        self._load = [0] * targets
        self._tree = [0] * targets + list(range(targets))  # load 0 everywhere: key = target
        for i in range(targets - 1, 0, -1):
            a, b = self._tree[2 * i], self._tree[2 * i + 1]
            self._tree[i] = a if a < b else b

    def __getitem__(self, target: int) -> int:
        return self._load[target]

    def add(self, target: int, tokens: int) -> None:
        """Change ``target``'s outstanding tokens by ``tokens`` (negative when requests leave)."""
        n, tree = self.targets, self._tree
        load = self._load[target] + tokens
        self._load[target] = load
        i = n + target
        tree[i] = load * n + target
        i >>= 1
        while i:
            a, b = tree[2 * i], tree[2 * i + 1]
            m = a if a < b else b
            if tree[i] == m:
                break  # the nodes above hold what they held
            tree[i] = m
            i >>= 1

    def least_loaded(self) -> int:
        """The target with the fewest outstanding tokens; ties to the lowest target."""
        return self._tree[1] % self.targets
