"""gateway: a STOMP and MQTT message broker on Trio."""

__version__ = "0.1.0"
