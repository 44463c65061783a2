"""The Python clients of the gateway's HTTP API: the producer, the reader, the demo producer."""
