"""The probe port's slots (gateway/admin/server.py), without a network: at
the bound a new connection takes the place of the oldest one of the address
holding the most, so an idle flood cannot keep a probe out."""

from __future__ import annotations

from gateway.admin.server import ProbeSlots


class Scope:
    """A connection's cancel scope, as far as the slots use it."""

    cancel_called = False

    def cancel(self):
        self.cancel_called = True


def test_a_full_probe_port_makes_room_from_the_most_crowded_address():
    slots = ProbeSlots(limit=4)
    flood = [Scope() for _ in range(3)]
    for scope in flood:
        slots.take("10.0.0.1", scope)
    other = Scope()
    slots.take("10.0.0.2", other)
    kubelet = Scope()
    slots.take("10.0.0.9", kubelet)  # full: the flood's oldest goes, nobody else's
    assert flood[0].cancel_called and not any(s.cancel_called for s in (*flood[1:], other, kubelet))
    assert slots.open == 4 and slots.evicted == 1
    slots.give("10.0.0.1", flood[0])  # its task ends later: already given back, not twice
    assert slots.open == 4
    slots.give("10.0.0.9", kubelet)
    assert slots.open == 3 and "10.0.0.9" not in slots.by_host
