"""Codecs: how each field's values are stored. See :mod:`rowstore.codecs.abc` for the contract.

Built-in codecs (registered here, in one visible block):

==========  =========================================  =========
id          values                                      placement
==========  =========================================  =========
``raw``     numbers, fixed shape                        row
``raw``     numbers, variable shape                     heap
``utf8``    ``str``                                     heap
``bytes``   ``bytes``                                   heap
``png``     ``uint8``/``uint16`` images, lossless       heap
``jpeg``    ``uint8`` images, lossy                     heap
``flac``    audio (float32/int16/int32), lossless      heap
``wav``     audio (float32/int16/int32), PCM/float     heap
==========  =========================================  =========

``png`` and ``jpeg`` also take images already encoded (PNG/JPEG bytes), stored as they are
after a header check (:mod:`rowstore.codecs.image`; :class:`~rowstore.codecs.abc.Encoded`);
``flac`` and ``wav`` take FLAC/WAV files' bytes the same way (:mod:`rowstore.codecs.audio`).

Placement is the codec's choice (:meth:`Codec.stored_nbytes`); a third-party codec may store
fixed-size values in the row too.
"""

from rowstore.codecs.abc import Codec, Encoded, Payloads
from rowstore.codecs.audio import Flac, Wav
from rowstore.codecs.image import Jpeg, Png
from rowstore.codecs.raw import Raw
from rowstore.codecs.registry import ENTRY_POINT_GROUP, get_codec, register_codec, registered_codecs
from rowstore.codecs.text import Bytes, Utf8

for _cls in (Raw, Utf8, Bytes, Png, Jpeg, Flac, Wav):
    register_codec(_cls)
del _cls

__all__ = [
    "Codec",
    "Encoded",
    "Payloads",
    "Raw",
    "Utf8",
    "Bytes",
    "Png",
    "Jpeg",
    "Flac",
    "Wav",
    "register_codec",
    "get_codec",
    "registered_codecs",
    "ENTRY_POINT_GROUP",
]
