"""The front door: listening sockets, per-address connection caps, gRPC options and the HTTP port.

A front child process accepts every port (``frontproc``, ``frontaccept``, ``tcpfront``, ``tlsfront``)
and enforces per-address connection caps (``connlimit``) within the file-descriptor budget
(``fdbudget``); ``grpcopts`` are the channel options shared by every server; ``http`` serves
``/health`` and ``/metrics``. Nothing here knows about groups or instances.
"""
