import stomp


def test_queue_roundtrip(broker):
    got = []

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame):
            got.append(frame.body)

    conn = stomp.Connection12([broker.stomp_address])
    conn.set_listener("l", Listener())
    conn.connect(wait=True)
    conn.subscribe("/queue/a", id="1")
    conn.send("/queue/a", "hi", receipt="r1")
    import time
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    conn.disconnect()
    assert got == ["hi"]
