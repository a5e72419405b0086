"""Where bytes meet sessions: the Trio listeners and per-connection tasks
(server.py), TLS contexts and certificate users (tls.py), and the WebSocket
adapter that carries STOMP and MQTT frames (websocket.py)."""
