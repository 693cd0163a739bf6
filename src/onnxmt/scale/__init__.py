"""Past one machine, on Ray (the `ray` extra): corpus translation on Ray Data, the service on Ray Serve."""
