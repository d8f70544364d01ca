"""``tail --peek``'s bookkeeping: look at a channel's backlog without taking it.

Nothing is FINed; every message goes back with REQ and no delay. nsqd sends each connection no
more than its RDY, and a REQ 0 puts a message at the back of that node's queue, so everything
here is per node (nsqd, topic): what was waiting there when the peek started (``backlog``), what
was looked at, what is held and what waits to be given back.

- The messages shown under -n (when -n <= --max-in-flight) are held to the end, so nsqd sends
  no more than -n; but a node whose RDY is all held while part of its backlog is still unseen
  gives them back (they come round again after the unseen ones, and are held then).
- The others are given back in bulk, only as many as that node's unseen messages can go ahead
  of (given back one by one, the first would come round again while the last are still being
  looked at), and always enough that the node is never left without room to send.
- A node is done when as many of its messages were looked at as it had waiting, or when one
  comes round again after that (held: no loop of redeliveries). A backlog larger than nsqd's
  --mem-queue-size comes from memory and disk at random, so messages given back may come round
  again before the end: given back again, and once as many came round again as were new on that
  node, it stops (``partial``; the other nodes go on).
- A node whose backlog is not known (its address did not match the one /stats was asked at)
  is done when one of its messages comes round again; the peek then also ends once as many
  messages were looked at as were waiting over all nodes.
"""

from __future__ import annotations


class _Node:
    __slots__ = ("backlog", "looked", "again", "held", "pending", "done", "responder")

    def __init__(self, backlog: int | None):
        self.backlog = backlog          # waiting when the peek started; None: not known
        self.looked = 0                 # distinct messages received
        self.again = 0                  # deliveries of a message already looked at
        self.held: list = []            # given back at the end (shown under -n, came round again)
        self.pending: list = []         # given back in bulk
        self.done = False               # every message waiting here was looked at (or partial)
        self.responder = None           # of its last message: the connection's RDY

    def rdy(self, default: int) -> int:
        return getattr(self.responder, "rdy", None) or default


class Peek:
    def __init__(self, count: int, max_in_flight: int):
        self.count = count
        self.max_in_flight = max_in_flight
        self.hold_shown = bool(count) and count <= max_in_flight
        self.nodes: dict = {}           # (nsqd TCP address, topic) -> _Node
        self.seen: set = set()          # (nsqd, topic, id): ids repeat across topics and nodes
        self.backlog = 0                # over all nodes
        self.given_back = 0
        self.partial = False

    # -- what was waiting ----------------------------------------------------------------------
    def add_backlog(self, topic: str, depths: dict) -> None:
        """``depths``: nsqd TCP address (or None: not known) -> depth of the channel there."""
        for address, depth in depths.items():
            self.backlog += depth
            if address is not None:
                node = self.nodes.get((address, topic))
                if node is None:
                    self.nodes[(address, topic)] = _Node(depth)
                else:  # a topic seen again (--topic-pattern): its backlog then
                    node.backlog = (node.backlog or 0) + depth
                    node.done = node.looked >= node.backlog > 0

    @property
    def looked(self) -> int:
        return sum(n.looked for n in self.nodes.values())

    @property
    def again(self) -> int:
        return sum(n.again for n in self.nodes.values())

    @property
    def wrapped(self) -> bool:
        """Every node's backlog was looked at (a node that stopped early, partial, is done: the
        others go on)."""
        nodes = self.nodes.values()
        if any(n.backlog is None for n in nodes):  # an address that did not match: over all nodes
            return any(n.done for n in nodes if n.backlog is None) or self.looked >= self.backlog > 0
        waiting = [n for n in nodes if n.backlog]
        if waiting:
            return all(n.done for n in waiting)
        return any(n.done for n in nodes)  # nothing was waiting: until a new message comes round again

    def held_and_pending(self) -> list:
        return [m for n in self.nodes.values() for m in n.held + n.pending]

    # -- each batch ----------------------------------------------------------------------------
    def first_seen(self, msgs: list) -> list:
        """The messages not looked at before; the others are held or given back."""
        first = []
        for m in msgs:
            node = self._node(m)
            key = (m.nsqd, m.topic, m.id)
            if key not in self.seen:
                self.seen.add(key)
                node.looked += 1
                if node.backlog and node.looked >= node.backlog:
                    node.done = True  # (the last of them are still shown)
                first.append(m)
                continue
            # back before the rest of the backlog was looked at: nsqd sends a backlog that is partly
            # on disk from memory and disk at random, and a REQ 0 goes to memory
            node.again += 1
            if node.backlog is None or node.looked >= node.backlog:
                node.held.append(m)
                node.done = True
            elif node.again >= max(node.looked, node.rdy(self.max_in_flight)):  # as many again as new
                node.held.append(m)
                node.done = self.partial = True
            else:
                node.pending.append(m)
        return first

    def _node(self, m) -> _Node:
        key = (m.nsqd, m.topic)
        node = self.nodes.get(key)
        if node is None:
            node = self.nodes[key] = _Node(None)
        node.responder = m.responder
        return node

    def shown(self, msgs: list) -> None:
        for m in msgs:
            node = self._node(m)
            (node.held if self.hold_shown else node.pending).append(m)

    def not_shown(self, m) -> None:
        self._node(m).pending.append(m)

    def give_back_some(self) -> None:
        """REQ, per node, some of what waits to be given back: as many as nsqd can replace by
        messages not looked at yet (it sends what is given back only after those), and always
        enough that the node is never left without room to send."""
        default = max(1, self.max_in_flight // max(1, len(self.nodes)))
        for node in self.nodes.values():
            if node.done or (node.backlog == 0 and self.backlog):
                continue  # nothing of the backlog left to send there: what it holds waits for the end
            rdy = node.rdy(default)
            unseen = node.backlog - node.looked if node.backlog is not None else 0
            if unseen > 0 and not node.pending and len(node.held) >= rdy:
                # all its RDY is held (shown under -n) and part of its backlog is unseen: nsqd would
                # send nothing more; give those back, they come round again after the unseen ones
                node.pending, node.held = node.held, []
            pending = node.pending
            free = rdy - len(node.held) - len(pending)  # room nsqd has (messages on their way take some)
            k = min(len(pending), unseen - free) if unseen > 0 else len(pending)
            if k > 0 and (len(pending) >= max(1, rdy // 2) or free <= 0):
                self._requeue(pending[:k])
                del pending[:k]

    def give_back(self) -> None:
        """REQ, with no delay, everything still held."""
        msgs = self.held_and_pending()
        for node in self.nodes.values():
            node.held, node.pending = [], []
        self._requeue(msgs)

    def _requeue(self, msgs: list) -> None:
        for m in msgs:
            if not m.responded:
                try:
                    m.requeue(delay=0, backoff=False)
                    self.given_back += 1
                except Exception:  # its connection is gone: nsqd gives it back itself
                    pass
