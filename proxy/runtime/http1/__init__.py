"""Interlock's own HTTP/1.1 client for upstreams: kept-alive connections, one request at a time
on each, the answer's body read by the caller's task as it arrives.

It replaces aiohttp's client on the proxied path because that client costs several times what
the exchange itself does (`python -m bench http`: the CPU per proxied request). It speaks only
what an upstream exchange needs: requests with a fixed-size or chunked body; answers framed by
Content-Length, chunked encoding or the connection's end; TLS through `ssl`; no redirects, no
cookies, no decompression (the proxy relays the upstream's bytes as they are).
"""

from proxy.runtime.http1.connection import Response
from proxy.runtime.http1.pool import Pool

__all__ = ["Pool", "Response"]
