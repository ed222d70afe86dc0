"""The training backends behind artsdk's ``Backend`` protocol, one folder each: ``local``
(torch + transformers + peft in this process) and ``remote`` (the HTTP client of, and the
server behind, ``artsdk serve``). artsdk finds them by entry point (``artsdk.backends``)."""
