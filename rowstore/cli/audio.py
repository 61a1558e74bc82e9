"""``rowstore from-audio``: a speech corpus (a folder tree of FLAC/WAV files, or a CSV/TSV
manifest) to a dataset, the audio files' bytes as they are."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rowstore.audio import from_audio
from rowstore.cli._common import _positive


def register(sub: Any) -> None:
    """Add ``from-audio`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "from-audio",
        help="write a speech corpus (a folder tree of FLAC/WAV files such as LibriSpeech, or a "
        "CSV/TSV manifest such as Common Voice's) as a dataset directory, the audio files' "
        "bytes as they are, with transcripts and speakers",
    )
    p.add_argument("src", help="the folder of audio files, or a .csv/.tsv manifest")
    p.add_argument("out", help="the dataset directory to write")
    p.add_argument(
        "--columns",
        type=json.loads,
        help='a manifest\'s columns by role, as JSON: {"path": ..., "transcript": ..., '
        '"speaker": ...} (default: path; sentence/transcript/text; client_id/speaker)',
    )
    p.add_argument(
        "--codec",
        help="the audio field's codec: flac (default when any file is .flac) or wav; files of "
        "the other format are decoded and encoded in it",
    )
    p.add_argument(
        "--dtype", default="float32", help="samples' dtype when read (float32, int16...)"
    )
    p.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="a damaged or unreadable file: stop naming it (default, nothing written) or skip "
        "it and list it",
    )
    p.add_argument(
        "--workers",
        type=_positive,
        help="processes writing shards (default: one per 512 MiB of audio, up to every core)",
    )
    p.add_argument("--no-path", action="store_true", help="do not store each file's path")
    p.add_argument(
        "--verify",
        action="store_true",
        help="decode every file in full (not only its header) before it is written",
    )
    p.add_argument(
        "--allow-outside",
        action="store_true",
        help="follow symlinks that lead out of SRC, and take manifest paths outside its folder "
        "(absolute or with '..'); by default both are refused",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_from_audio)


def _from_audio(args: argparse.Namespace) -> int:
    if args.columns is not None and not isinstance(args.columns, dict):
        raise ValueError(f"--columns must be a JSON object, got {args.columns!r}")
    done = from_audio(
        args.src,
        args.out,
        columns=args.columns,
        codec=args.codec,
        dtype=args.dtype,
        on_error=args.on_error,
        workers=args.workers,
        path_field=None if args.no_path else "path",
        verify_encoded=args.verify,
        allow_outside=args.allow_outside,
        progress=not args.quiet,
    )
    sys.stdout.write(f"{args.out}: {done}\n")
    return 0
