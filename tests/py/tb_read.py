#!/usr/bin/env python3
"""tests/py/tb_read.py — what TensorBoard's own readers find in an events directory, as JSON
(tests/lua/test_tensorboard.lua compares it with what lutra wrote). Run in the venv that
tests/py/tb_venv.sh makes.

  python tb_read.py DIR          {"files", "scalars", "histograms", "texts", "plugins", "records"}
  python tb_read.py --records F  {"count", "error"}: F's records through TensorBoard's record
                                 reader, which checks both CRCs of each (error: DataLossError's text)
  python tb_read.py --crc TEXT   {"crc32c", "masked"}: TensorBoard's crc32c of the UTF-8 bytes

Values that JSON cannot hold (NaN, infinities) come as the strings "nan", "inf", "-inf".
"""
import glob, json, math, os, struct, sys

from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
from tensorboard.compat.proto import event_pb2


def plain(x):
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


def records(path):
    """Every record through TensorBoard's reader (CRCs checked), and each CRC recomputed here."""
    reader = pywrap_tensorflow.PyRecordReader_New(path)
    out, error = [], None
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            break
        except errors.DataLossError as e:
            error = str(e)
            break
        out.append(reader.record())
    # the framing again by hand, with TensorBoard's masked_crc32c
    data, at, framed = open(path, "rb").read(), 0, 0
    while at < len(data) and error is None:
        n, hcrc = struct.unpack_from("<QI", data, at)
        assert hcrc == pywrap_tensorflow.masked_crc32c(data[at:at + 8]), f"{path}: header crc at {at}"
        body = data[at + 12:at + 12 + n]
        (dcrc,) = struct.unpack_from("<I", data, at + 12 + n)
        assert dcrc == pywrap_tensorflow.masked_crc32c(body), f"{path}: data crc at {at}"
        at, framed = at + 16 + n, framed + 1
    return out, error, framed


def main(argv):
    if argv[1] == "--records":
        recs, error, _ = records(argv[2])
        return {"count": len(recs), "error": error}
    if argv[1] == "--crc":
        b = argv[2].encode()
        return {"crc32c": pywrap_tensorflow.crc32c(b), "masked": pywrap_tensorflow.masked_crc32c(b)}
    d = argv[1]
    files = sorted(glob.glob(os.path.join(d, "*tfevents*")))
    result = {"files": [os.path.basename(f) for f in files], "records": {}}
    for f in files:
        recs, error, framed = records(f)
        first = event_pb2.Event.FromString(recs[0]) if recs else None
        result["records"][os.path.basename(f)] = {
            "count": len(recs), "framed": framed, "error": error,
            "file_version": first.file_version if first else None}
    acc = event_accumulator.EventAccumulator(d, size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    result["scalars"] = {t: [[e.step, e.value, e.wall_time] for e in acc.Scalars(t)] for t in tags["scalars"]}
    result["histograms"] = {
        t: [dict(step=e.step, min=h.min, max=h.max, num=h.num, sum=h.sum, sum_squares=h.sum_squares,
                 bucket_limit=list(h.bucket_limit), bucket=list(h.bucket))
            for e in acc.Histograms(t) for h in [e.histogram_value]]
        for t in tags["histograms"]}
    # what the TensorBoard app shows: the plugin accumulator, with its data_compat conversions and
    # its handling of restarts (a session START after the first drops the later steps read before)
    pacc = plugin_event_accumulator.EventAccumulator(d, size_guidance={"tensors": 0})
    pacc.Reload()
    result["plugins"] = {p: sorted(pacc.PluginTagToContent(p)) for p in pacc.ActivePlugins()}
    result["texts"] = {
        t: [dict(step=e.step, text=[s.decode("utf-8") for s in e.tensor_proto.string_val],
                 dtype=e.tensor_proto.dtype, plugin=pacc.SummaryMetadata(t).plugin_data.plugin_name)
            for e in pacc.Tensors(t)]
        for t in pacc.PluginTagToContent("text")} if "text" in pacc.ActivePlugins() else {}
    result["app_steps"] = {t: [e.step for e in pacc.Tensors(t)] for p in pacc.ActivePlugins()
                           for t in pacc.PluginTagToContent(p)}
    return result


if __name__ == "__main__":
    json.dump(plain(main(sys.argv)), sys.stdout)
