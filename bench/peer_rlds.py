"""The hand-written RLDS peer: what a user writes to turn an RLDS dataset's episodes into MP4s and rows.

    python bench/peer_rlds.py SRC DST [--videos-only]

Single process, straight line, protobuf + PyAV + pyarrow: read each TFRecord shard, parse every
`tf.train.Example`, decode each camera's JPEGs and encode them to H.264 with the pipeline's
encoder settings (crf 16, a keyframe every 10 frames, preset medium, mbtree=0, yuv420p limited
range) and the encoder's default threading, and write the numeric steps as one zstd Parquet file.
`--videos-only` is the bare loop: decode and encode the frames, nothing else (the CPU-per-frame floor).
"""

from __future__ import annotations

import glob
import json
import os
import sys
from fractions import Fraction

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from av.video.reformatter import ColorRange
from tensorflow_datasets.proto import tf_example_pb2

FPS = 10


def records(path: str):
    with open(path, "rb") as handle:
        while header := handle.read(12):
            length = int.from_bytes(header[:8], "little")
            yield handle.read(length)
            handle.read(4)


def encode(images, target: str) -> int:
    rate = Fraction(FPS)
    output = av.open(target, "w", format="mp4")
    stream = None
    for count, data in enumerate(images):
        frame = av.CodecContext.create("mjpeg", "r").decode(av.Packet(data))[0]
        if stream is None:
            stream = output.add_stream("libx264", rate=rate)
            stream.width, stream.height, stream.pix_fmt = frame.width, frame.height, "yuv420p"
            stream.codec_context.time_base = 1 / rate
            stream.codec_context.color_range = 1
            stream.options = {"crf": "16", "g": "10", "preset": "medium", "x264-params": "mbtree=0"}
        frame = frame.reformat(format="yuv420p", dst_color_range=ColorRange.MPEG)
        # A decoded JPEG says it is an I picture, and x264 obeys: left alone, every frame is
        # encoded intra (1.6x less CPU, 10 % bigger files), not the pipeline's settings.
        frame.pts, frame.time_base, frame.pict_type = count, 1 / rate, av.video.frame.PictureType.NONE
        for packet in stream.encode(frame):
            output.mux(packet)
    for packet in stream.encode(None):
        output.mux(packet)
    output.close()
    return count + 1


def main(src: str, dst: str, videos_only: bool) -> None:
    features = json.load(open(f"{src}/features.json"))
    steps = features["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"]
    cameras = [f"steps/observation/{name}" for name, spec in steps["observation"]["featuresDict"]["features"].items()
               if "image" in spec]
    rows: dict[str, list] = {"sequence_id": [], "length": [], "state": [], "action": []}
    for shard in sorted(glob.glob(f"{src}/*.tfrecord-*")):
        for index, data in enumerate(records(shard)):
            feature = tf_example_pb2.Example.FromString(data).features.feature
            sequence_id = f"{os.path.basename(shard)}_{index:06d}"
            for camera in cameras:
                folder = f"{dst}/files/{camera.rsplit('/', 1)[-1]}"
                os.makedirs(folder, exist_ok=True)
                encode(feature[camera].bytes_list.value, f"{folder}/{sequence_id}.mp4")
            if videos_only:
                continue
            state = np.asarray(feature["steps/observation/state"].float_list.value, np.float32).reshape(-1, 8)
            action = np.asarray(feature["steps/action"].float_list.value, np.float32).reshape(-1, 7)
            rows["sequence_id"].append(sequence_id)
            rows["length"].append(len(state))
            rows["state"].append(state.astype(np.float64).tolist())
            rows["action"].append(action.tolist())
    if not videos_only:
        os.makedirs(f"{dst}/data", exist_ok=True)
        pq.write_table(pa.table(rows), f"{dst}/data/part-00000.parquet", compression="zstd")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--videos-only" in sys.argv[3:])
