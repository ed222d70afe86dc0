"""``artsdk view``: a local web page over the trajectory store (see ``app.py``)."""
