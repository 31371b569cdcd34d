"""Federated-learning aggregation on the same store: the job engine (rounds,
validation, aggregation) and the client side that submits updates."""
