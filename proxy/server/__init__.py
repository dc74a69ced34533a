"""The data plane's HTTP/1.1 server: requests parsed by httptools, answered through a :class:`Responder`.

See :mod:`proxy.server.connection` for why the data plane does not sit on aiohttp's server.
"""
