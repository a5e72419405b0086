"""The admin surface on its own port: h11 HTTP server (server.py), its
request and response values (http.py), the JSON API (api.py), the topic
archive's Arrow endpoint (archive.py), the console page and the metrics."""
