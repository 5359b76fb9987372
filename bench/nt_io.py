"""Files shared with the engine: IDX data sets (raw or .gz) and safetensors checkpoints.

Normalization is the engine's, in float32 with the same operations in the same order
(data/dataset.cpp, kernels/cpu/batch.cpp): x = (pixel / 255 - mean[c]) / std[c] for channel c, each step rounded
to float32; images planar (N, C, H, W), rank-4 IDX files (channels last) transposed as the engine does.
It runs once on the host with NumPy, so no GPU division-by-scalar shortcut (PyTorch multiplies by the
reciprocal there) can make the inputs differ from the engine's by an ulp.
MNIST uses the field's constants 0.1307 / 0.3081; any other data set the mean and population standard
deviation of its train pixels per channel, computed as data/dataset.cpp does (a byte histogram, in double).

safetensors are read and written here with NumPy alone (the format is a length, a JSON header and raw
little-endian bytes), so the scripts need no extra package; when the `safetensors` package is installed,
`load_checkpoint` reads the engine's file with it instead, which also proves the file is standard.
"""
import gzip
import json
import os
import struct

import numpy as np

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
STANDARD_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                  "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


# ---- IDX -------------------------------------------------------------------------------------------

def read_idx(path):
    """An IDX file of unsigned bytes (raw or gzip, by content) as a NumPy uint8 array of its dimensions."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    rank = data[3]
    dims = struct.unpack(">" + "I" * rank, data[4:4 + 4 * rank])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank)
    if body.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {body.size} bytes of data for dimensions {dims}")
    return body.reshape(dims)


def find_data_dir(given=None, dataset="mnist"):
    """--data, then $NT_DATA_DIR, then ./.data/<dataset>, as `nanotrain train` looks."""
    for d in (given, os.environ.get("NT_DATA_DIR"), os.path.join(".data", dataset),
              os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".data", dataset)):
        if d and os.path.isdir(d):
            return d
    raise SystemExit(f"no {dataset} folder: pass --data DIR or set NT_DATA_DIR (scripts/fetch-data {dataset})")


def sample_shape(dataset):
    """(C, H, W) of one example: CIFAR-10's 3x32x32, else MNIST's 1x28x28 (the IDX sets the baselines use)."""
    return (3, 32, 32) if dataset == "cifar10" else (1, 28, 28)


def load_cifar10(data_dir):
    """CIFAR-10's binary batches (data/cifar.cpp): records of 1 label byte and 3072 planar RGB bytes;
    data_batch_1..5.bin train, test_batch.bin test. Returns planar (N, 3, 32, 32) images and labels."""
    def read(names):
        records = []
        for name in names:
            raw = np.fromfile(os.path.join(data_dir, name), dtype=np.uint8)
            if raw.size % 3073:
                raise SystemExit(f"{data_dir}/{name}: {raw.size} bytes, not a multiple of 3073")
            records.append(raw.reshape(-1, 3073))
        records = np.concatenate(records)
        return np.ascontiguousarray(records[:, 1:].reshape(-1, 3, 32, 32)), records[:, 0].copy()
    tr_x, tr_y = read([f"data_batch_{i}.bin" for i in range(1, 6)])
    te_x, te_y = read(["test_batch.bin"])
    return tr_x, tr_y, te_x, te_y


def load_split(data_dir, dataset="mnist"):
    """The four standard files (raw preferred, else .gz): (train_images, train_labels, test_images, test_labels);
    CIFAR-10's batches for dataset "cifar10"."""
    if dataset == "cifar10":
        return load_cifar10(data_dir)
    out = []
    for name in STANDARD_FILES:
        raw, gz = os.path.join(data_dir, name), os.path.join(data_dir, name + ".gz")
        path = raw if os.path.isfile(raw) else gz
        if not os.path.isfile(path):
            raise SystemExit(f"{data_dir}: missing {name} (raw or .gz)")
        out.append(read_idx(path))
    return tuple(out)


def planar(images):
    """Images as the engine lays them out, (N, C, H, W): a rank-3 file's (N, H, W) gets C = 1, a rank-4 file's
    (N, H, W, C), channels last, is transposed (data/dataset.cpp)."""
    if images.ndim == 3:
        return images[:, None]
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2))


def normalization(dataset, train_images):
    """(mean, std), float32 arrays of one value per channel, exactly as data/dataset.cpp chooses them.
    train_images: planar (N, C, H, W), or (N, H, W) for one channel."""
    images = planar(train_images) if train_images.ndim == 3 else train_images
    channels = images.shape[1]
    if dataset == "mnist" and channels == 1:
        return np.array([MNIST_MEAN], np.float32), np.array([MNIST_STD], np.float32)
    means, stds = [], []
    for c in range(channels):
        hist = np.bincount(images[:, c].reshape(-1), minlength=256)
        n = float(images[:, c].size)
        mean = 0.0
        for v in range(256):
            mean += float(hist[v]) * (v / 255.0)
        mean /= n
        var = 0.0
        for v in range(256):
            dev = v / 255.0 - mean
            var += float(hist[v]) * dev * dev
        means.append(mean)
        stds.append((var / n) ** 0.5)
    return np.array(means, np.float32), np.array(stds, np.float32)


def normalize(images, mean, std):
    """uint8 planar (N, C, H, W), or (N, H, W) for one channel -> float32 (N, C*H*W):
    ((x / 255) - mean[c]) / std[c], each operation rounded to float32."""
    images = planar(images) if images.ndim == 3 else images
    n, channels = images.shape[0], images.shape[1]
    mean = np.asarray(mean, np.float32).reshape(1, -1, 1)
    std = np.asarray(std, np.float32).reshape(1, -1, 1)
    x = images.reshape(n, channels, -1).astype(np.float32)
    x = x / np.float32(255.0)
    x = x - mean
    return (x / std).reshape(n, -1)


def load_dataset(data_dir, dataset="mnist", train_limit=0):
    """Normalized float32 inputs (N, C*H*W), planar, and int64 labels: (x_train, y_train, x_test, y_test)."""
    tr_x, tr_y, te_x, te_y = load_split(data_dir, dataset)
    if tr_x.ndim != 4 or dataset != "cifar10":
        tr_x, te_x = planar(tr_x), planar(te_x)
    mean, std = normalization(dataset, tr_x)   # from the full train split, as the engine
    if train_limit and train_limit < tr_x.shape[0]:
        tr_x, tr_y = tr_x[:train_limit], tr_y[:train_limit]
    return (normalize(tr_x, mean, std), tr_y.astype(np.int64), normalize(te_x, mean, std), te_y.astype(np.int64))


# ---- safetensors -------------------------------------------------------------------------------------

_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8,
           "I8": np.int8, "I16": np.int16, "F16": np.float16, "BOOL": np.bool_}


def read_safetensors(path):
    """({name: np.ndarray}, metadata) with the same validation rules as engine/checkpoint.cpp."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: {len(data)} bytes, fewer than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    block = memoryview(data)[8 + n:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors, spans = {}, []
    for name, e in header.items():
        if e["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor '{name}': unsupported dtype {e['dtype']}")
        b, end = e["data_offsets"]
        dt = np.dtype(_DTYPES[e["dtype"]]).newbyteorder("<")
        count = int(np.prod(e["shape"])) if e["shape"] else 1
        if end > len(block) or end - b != count * dt.itemsize:
            raise ValueError(f"{path}: tensor '{name}': data_offsets {b, end} do not fit")
        tensors[name] = np.frombuffer(block[b:end], dtype=dt).reshape(e["shape"]).copy()
        spans.append((b, end, name))
    at = 0
    for b, end, name in sorted(spans):
        if b != at:
            raise ValueError(f"{path}: tensor '{name}' leaves a gap or overlaps")
        at = end
    if at != len(block):
        raise ValueError(f"{path}: {len(block) - at} bytes after the last tensor")
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None):
    """Atomically (PATH.tmp, fsync, rename), float32/float64/int tensors as given, in dict order."""
    inv = {np.dtype(v).newbyteorder("<"): k for k, v in _DTYPES.items()}
    header, blobs, at = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        blob = a.tobytes()
        header[name] = {"dtype": inv[a.dtype], "shape": list(a.shape), "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path):
    """(state dict of torch tensors, metadata, reader): the `safetensors` package when installed, else ours."""
    import torch
    try:
        from safetensors import safe_open
    except ImportError:
        arrays, metadata = read_safetensors(path)
        return {k: torch.from_numpy(v) for k, v in arrays.items()}, metadata, "bench/nt_io.py"
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, (f.metadata() or {}), "safetensors"
