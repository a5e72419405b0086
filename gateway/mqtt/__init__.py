"""MQTT 3.1, 3.1.1 and 5.0: the sans-IO codec (``codec/``) and the session, with what the session owns beside it (CONNECT, subscriptions, in-flight QoS, wills and session lifetimes)."""
