"""MQTT 3.1.1 transport (codec and session); arrives with the MQTT issue."""
