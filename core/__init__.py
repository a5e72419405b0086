"""The broker model: destinations, subscriptions, dispatch, acks and transactions.

Pure, synchronous Python.  Nothing here awaits, touches a socket or a file, or
reads the wall clock: time comes from an injected :class:`core.ports.Clock`,
deliveries leave through :class:`core.ports.Sink`.  Nothing here knows which
wire protocol a client speaks.
"""
