"""STOMP 1.0/1.1/1.2 transport: the sans-IO codec and the session."""
