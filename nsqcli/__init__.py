"""nsqcli: the NSQ command-line suite and its threaded client core.

    from nsqcli import Consumer, Producer, Message
"""

from .version import __version__

__all__ = ["__version__", "Consumer", "Producer", "Message", "Config"]


def __getattr__(name: str):
    # Lazy: `nsqcli pub` must not pay for the consumer's imports.
    if name == "Consumer":
        from .client.consumer import Consumer
        return Consumer
    if name == "Producer":
        from .client.producer import Producer
        return Producer
    if name == "Message":
        from .client.message import Message
        return Message
    if name == "Config":
        from .client.config import Config
        return Config
    raise AttributeError(f"module 'nsqcli' has no attribute {name!r}")
