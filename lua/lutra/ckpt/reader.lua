-- lutra.ckpt.reader — loading a sharded checkpoint (lutra.ckpt.format), resharding on the way:
-- any box of any tensor is assembled from whatever saved pieces intersect it.
--
--   local r = ckpt.load("runs/x/ckpt/step_000200")
--   r.manifest                       -- step, layout, config, tensors ...
--   r:read("wte.weight", {0, 0}, {100, 64}, out)   -- that box of the global tensor into out
--   r:tensor("wte.weight")           -- the whole tensor (a new CPU tensor)
--   r:load_into({{name =, tensor =}, ...})   -- each local tensor's spec boxes (any layout)
--   r:extra(rank)                    -- that rank's saved extra table
--   r:verify()                       -- decodes every file: true, or false and why
--   ckpt.latest(run_dir)             -- the newest valid checkpoint (falls back past bad ones)
-- Every piece is checked as it decodes (lz4 frame checksums, sizes, the footer's piece
-- checksum), and the manifest is validated in C (lt_ckpt_manifest_check) before it is used:
-- every path it names is a plain file name, and lutra.ckpt.checks.paths refuses one that a
-- symlink leads out of the directory. verify adds what needs no model (lutra.ckpt.checks):
-- each piece's element size against its dtype, and for a trainer checkpoint (manifest kind
-- "train") its step against its step_NNNNNN directory name, its tensors' dtypes and shapes
-- and every rank's extra state (other checkpoints may be saved under any name and hold any
-- tensors and extra state). Errors name the checkpoint file, the tensor or field and the
-- problem.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local ops = require "lutra.ops"
local json = require "lutra.json"
local spec = require "lutra.dist.spec"
local create = require "lutra.create"
local ckpt_files = require "lutra.ckpt.files"
require "lutra.tensor" -- the tensor metatype (methods, properties) for what this module makes
local format = require "lutra.ckpt.format"
local checks = require "lutra.ckpt.checks"
local ffi, C = lt.ffi, lt.C

local M = {}
local raise, is_tensor = errors.raise, ops.is_tensor

local function last_error() return ffi.string(C.lt_last_error()) end

local Reader = {}
Reader.__index = Reader

-- Reads the manifest (validated) and indexes the tensors; the shard files are opened lazily.
function M.load(dir)
  if type(dir) ~= "string" or dir == "" then raise("ckpt.load: dir must be a path string") end
  dir = dir:gsub("/+$", "")
  local path = dir .. "/manifest.json"
  local text = ckpt_files.read(path)
  if not text then
    if ckpt_files.exists(dir .. "/manifest.lua") then
      raise("ckpt.load: " .. dir .. "/manifest.lua: the single-process checkpoint format "
        .. "(manifest.lua) is no longer read; a lutra checkpoint is a directory with manifest.json")
    end
    if ckpt_files.is_dir(dir) then raise("ckpt.load: " .. dir .. " is incomplete: it has no manifest.json") end
    raise("ckpt.load: no checkpoint at " .. dir)
  end
  local nt, np = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  if C.lt_ckpt_manifest_check(text, #text, path, nt, np) ~= 0 then raise("ckpt.load: " .. last_error()) end
  local m = json.decode(text)
  checks.paths(dir, m)
  local r = setmetatable({dir = dir, manifest = m, by_name = {}, index = {}, cache = nil}, Reader)
  for _, t in ipairs(m.tensors) do r.by_name[t.name] = t end
  return r
end

-- The footer of file k (0-based), cached: a list of lt_ckpt_piece.
function Reader:file_index(k)
  local idx = self.index[k]
  if idx then return idx end
  local name = self.manifest.files[k + 1]
  local path = self.dir .. "/" .. name
  if not ckpt_files.exists(path) then raise("ckpt.load: " .. path .. " is missing (rank " .. k .. "'s shard was deleted?)") end
  local count, size = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  if C.lt_ckpt_read_index(path, nil, 0, count, size) ~= 0 then raise("ckpt.load: " .. last_error()) end
  local n = tonumber(count[0])
  local pieces = ffi.new("lt_ckpt_piece[?]", math.max(n, 1))
  if C.lt_ckpt_read_index(path, pieces, n, count, size) ~= 0 then raise("ckpt.load: " .. last_error()) end
  idx = {path = path, name = name, n = n, pieces = pieces, size = tonumber(size[0])}
  self.index[k] = idx
  return idx
end

-- Checks a manifest piece against its file's footer; returns the file index and the entry.
function Reader:piece_entry(t, k, p)
  local idx = self:file_index(p.file)
  if p.index >= idx.n then
    raise(string.format("ckpt.load: %s: tensor '%s' piece %d: %s holds %d pieces, the manifest says piece %d: size mismatch",
      self.dir, t.name, k, idx.name, idx.n, p.index))
  end
  local e = idx.pieces[p.index]
  if tonumber(e.raw_bytes) ~= p.bytes then
    raise(string.format("ckpt.load: %s: tensor '%s' piece %d: the manifest says %d bytes, %s piece %d holds %d: size mismatch",
      self.dir, t.name, k, p.bytes, idx.name, p.index, tonumber(e.raw_bytes)))
  end
  -- a shuffled piece was written by elements of its dtype's size
  if e.shuffle > 1 and e.shuffle ~= format.DTYPE_SIZE[t.dtype] then
    raise(string.format("ckpt.load: %s: tensor '%s' piece %d: the manifest says %s, but %s piece %d holds %d-byte "
      .. "elements: dtype mismatch", self.dir, t.name, k, t.dtype, idx.name, p.index, e.shuffle))
  end
  return idx, e
end

function Reader:info(name)
  local t = self.by_name[name]
  if not t then raise("ckpt: " .. self.dir .. " has no tensor '" .. tostring(name) .. "'") end
  return t
end

function Reader:names()
  local out = {}
  for i, t in ipairs(self.manifest.tensors) do out[i] = t.name end
  return out
end

-- Decodes piece k of tensor t into a CPU tensor of the piece's shape (the last one is cached).
function Reader:decode(t, k)
  local p = t.pieces[k]
  local key = t.name .. "#" .. k
  if self.cache and self.cache.key == key then return self.cache.tensor end
  local idx, e = self:piece_entry(t, k, p)
  local buf = create.empty(p.shape, {dtype = t.dtype})
  self:decode_into(t, k, idx, e, buf)
  self.cache = {key = key, tensor = buf}
  return buf
end

-- Copies the box (rel, is) of piece k into dst, decoding only the piece's rows rel[1] ..
-- rel[1] + is[1] - 1 (their bytes are one range: row-major pieces). Straight into dst when
-- it is those whole rows, contiguous, on the CPU.
function Reader:read_rows(t, k, rel, is, dst)
  local p = t.pieces[k]
  local idx, e = self:piece_entry(t, k, p)
  local row_bytes = ckpt_files.numel(p.shape) / p.shape[1] * format.DTYPE_SIZE[t.dtype]
  local full = true
  for d = 2, #is do full = full and is[d] == p.shape[d] end
  local buf = dst
  if not (full and dst.device == "cpu" and C.lt_is_contiguous(dst) ~= 0) then
    local rows = {}
    for d = 1, #p.shape do rows[d] = p.shape[d] end
    rows[1] = is[1]
    buf = create.empty(rows, {dtype = t.dtype})
  end
  if C.lt_ckpt_read_range(idx.path, p.index, e, rel[1] * row_bytes, is[1] * row_bytes, C.lt_data_ptr(buf)) ~= 0 then
    raise(string.format("ckpt.load: tensor '%s' (piece %d): %s", t.name, k, last_error()))
  end
  if buf ~= dst then
    local r0 = {}
    for d = 1, #rel do r0[d] = rel[d] end
    r0[1] = 0
    ckpt_files.copy(dst, ckpt_files.box_view(buf, r0, is))
  end
end

function Reader:decode_into(t, k, idx, e, buf)
  if C.lt_ckpt_read_piece(idx.path, t.pieces[k].index, e, C.lt_data_ptr(buf), tonumber(e.raw_bytes)) ~= 0 then
    raise(string.format("ckpt.load: tensor '%s' (piece %d): %s", t.name, k, last_error()))
  end
end

-- Fills out (a tensor of `shape` and the tensor's dtype, any device and layout; nil: a new
-- CPU tensor) with the box [offset, offset + shape) of the global tensor `name`.
function Reader:read(name, offset, shape, out)
  local t = self:info(name)
  local nd = #t.shape
  offset = offset or {}
  shape = shape or {}
  for d = 1, nd do
    offset[d] = offset[d] or 0
    shape[d] = shape[d] or (t.shape[d] - offset[d])
    if offset[d] < 0 or shape[d] < 0 or offset[d] + shape[d] > t.shape[d] then
      raise(string.format("ckpt.read: '%s' {%s}: the box at {%s} of shape {%s} does not fit", name,
        table.concat(t.shape, ", "), table.concat(offset, ", "), table.concat(shape, ", ")))
    end
  end
  if out == nil then
    out = create.empty(shape, {dtype = t.dtype})
  else
    if not is_tensor(out) then raise("ckpt.read: out must be a tensor") end
    if out.dtype ~= t.dtype then raise(string.format("ckpt.read: '%s' is %s, out is %s", name, t.dtype, out.dtype)) end
    local ok = out.ndim == nd
    for d = 1, nd do ok = ok and out:size(d - 1) == shape[d] end
    if not ok then
      raise(string.format("ckpt.read: '%s': out has shape {%s}, the box {%s}", name, table.concat(out.shape, ", "),
        table.concat(shape, ", ")))
    end
  end
  local covered = 0
  for k, p in ipairs(t.pieces) do
    local io_, is = ckpt_files.intersect(p.offset, p.shape, offset, shape)
    if nd == 0 then io_, is = {}, {} end
    if io_ then
      local whole = true
      for d = 1, nd do whole = whole and p.offset[d] == offset[d] and p.shape[d] == shape[d] end
      if whole and out.device == "cpu" and C.lt_is_contiguous(out) ~= 0 then -- straight into out
        local idx, e = self:piece_entry(t, k, p)
        self:decode_into(t, k, idx, e, out)
      else
        local rel, dst = ckpt_files.sub(io_, p.offset), ckpt_files.box_view(out, ckpt_files.sub(io_, offset), is)
        local cached = self.cache and self.cache.key == t.name .. "#" .. k
        if nd >= 1 and is[1] < p.shape[1] and not cached then
          -- rows [rel[1], rel[1] + is[1]) of the piece: only the frames that hold them are decoded
          self:read_rows(t, k, rel, is, dst)
        else
          ckpt_files.copy(dst, ckpt_files.box_view(self:decode(t, k), rel, is))
        end
      end
      covered = covered + ckpt_files.numel(is)
    end
  end
  if covered ~= ckpt_files.numel(shape) then
    raise(string.format("ckpt.read: %s: tensor '%s': the saved pieces cover %d of the %d elements asked for", self.dir,
      name, covered, ckpt_files.numel(shape)))
  end
  return out
end

function Reader:tensor(name) return self:read(name, nil, nil, nil) end

-- Fills each local tensor's boxes (lutra.dist.spec: any layout, dup copies included) from
-- the checkpoint: resharding. entries: {{name =, tensor =}, ...}; a name the checkpoint
-- lacks is an error unless opts.strict == false (then it is returned in the list of missing).
function Reader:load_into(entries, opts)
  local missing = {}
  for _, e in ipairs(entries) do
    local t = self.by_name[e.name]
    if not t then
      if not opts or opts.strict ~= false then raise("ckpt.load: " .. self.dir .. " has no tensor '" .. e.name .. "'") end
      missing[#missing + 1] = e.name
    else
      local g = spec.global_shape(e.tensor)
      if table.concat(g, ",") ~= table.concat(t.shape, ",") then
        raise(string.format("ckpt.load: '%s' is {%s} in the checkpoint, the model's is {%s}", e.name,
          table.concat(t.shape, ", "), table.concat(g, ", ")))
      end
      for _, b in ipairs(spec.boxes(e.tensor)) do
        self:read(e.name, b.offset, b.shape, ckpt_files.box_view(e.tensor, b.local_offset, b.shape))
      end
    end
  end
  self.cache = nil
  return missing
end

-- The extra table rank r saved (default 0).
function Reader:extra(r)
  r = r or 0
  local name = (self.manifest.extra or {})[r + 1]
  if not name then raise(string.format("ckpt: %s has no extra state for rank %d (world %d)", self.dir, r,
      self.manifest.world or 0)) end
  local s = ckpt_files.read(self.dir .. "/" .. name)
  if not s then raise("ckpt.load: " .. self.dir .. "/" .. name .. " is missing") end
  local ok, v = pcall(json.decode, s)
  if not ok then raise("ckpt.load: " .. self.dir .. "/" .. name .. " is corrupt: " .. tostring(v):gsub("^[^:]*:%d+: ", "")) end
  return v
end

-- Structure (files, footers, every manifest piece against its footer, extras), and with
-- full (default) every frame decoded and checked. true, or false and the reason.
function Reader:verify(full)
  local ok, err = pcall(function()
    local m = self.manifest
    if m.kind == "train" then
      checks.step_name(self.dir, m)
      checks.train_tensors(self.dir, m)
      for r = 0, #m.files - 1 do
        checks.train_extra(self:extra(r), m.step, self.dir .. "/" .. m.extra[r + 1])
      end
    end
    for _, t in ipairs(self.manifest.tensors) do
      for k, p in ipairs(t.pieces) do self:piece_entry(t, k, p) end
    end
    for r = 0, #self.manifest.files - 1 do
      self:file_index(r)
      self:extra(r)
    end
    if full ~= false then
      for _, name in ipairs(self.manifest.files) do
        if C.lt_ckpt_verify_file(self.dir .. "/" .. name, nil, nil) ~= 0 then raise(last_error()) end
      end
    end
  end)
  if ok then return true end
  return false, tostring(err):gsub("^[^:]*:%d+: ", "")
end

-- ---- a run directory: latest ------------------------------------------------------------------

-- Whether dir is a loadable checkpoint: true, or false and why.
function M.validate(dir, full)
  local ok, r = pcall(M.load, dir)
  if not ok then return false, tostring(r):gsub("^[^:]*:%d+: ", "") end
  return r:verify(full)
end

-- The newest valid checkpoint under root: the one `latest` names, else the step_* dirs from
-- the newest down; each invalid one is skipped with a note on stderr (opts.quiet: none) and
-- listed in the second result ({{dir =, why =, rejected =}}). opts.full = false checks structure
-- only. opts.accept(dir) -> ok, why: a further test a valid one must pass (resume: it restores
-- into the run), skipped like an invalid one when it fails (rejected = true). nil when there is
-- none.
function M.latest(root, opts)
  opts = opts or {}
  if type(root) ~= "string" then raise("ckpt.latest: root must be a path string") end
  root = root:gsub("/+$", "")
  local cands, seen = {}, {}
  local named = (ckpt_files.read(root .. "/latest") or ""):match("^%s*(.-)%s*$")
  if named ~= "" and not named:find("/") then
    cands[1] = named
    seen[named] = true
  end
  for _, s in ipairs(ckpt_files.steps(root)) do
    if not seen[s.name] then cands[#cands + 1] = s.name end
  end
  local skipped = {}
  for _, name in ipairs(cands) do
    local dir = root .. "/" .. name
    local ok, why = M.validate(dir, opts.full)
    local rejected = false
    if ok and opts.accept then
      ok, why = opts.accept(dir)
      rejected = not ok
    end
    if ok then return dir, skipped end
    skipped[#skipped + 1] = {dir = dir, why = why, rejected = rejected}
    if not opts.quiet then io.stderr:write("ckpt: skipping ", dir, ": ", why, "\n") end
  end
  return nil, skipped
end

return M
