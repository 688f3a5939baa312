-- conv_spec.lua — conv2d, conv_transpose2d and nearest interpolate (NCHW) against nested-loop
-- references over :tolist() tables, gradients by finite differences in f64, errors.
-- Shape letters: B batch, C channels, H/W height and width, kh/kw kernel size.
local keng = require "keng"
local H = require "helper"

local function pair(v) if type(v) == "table" then return v[1], v[2] end return v, v end

-- direct convolution: x [B, Cin, H, W], w [Cout, Cin/G, kh, kw], b [Cout] or nil
local function ref_conv2d(x, w, b, o)
  o = o or {}
  local sh, sw = pair(o.stride or 1)
  local ph, pw = pair(o.padding or 0)
  local dh, dw = pair(o.dilation or 1)
  local G = o.groups or 1
  local X, Wt, Bt = x:tolist(), w:tolist(), b and b:tolist()
  local B, Cin, Hh, Ww = table.unpack(x.shape)
  local Cout, Cg, kh, kw = table.unpack(w.shape)
  local Ho = (Hh + 2 * ph - dh * (kh - 1) - 1) // sh + 1
  local Wo = (Ww + 2 * pw - dw * (kw - 1) - 1) // sw + 1
  local Mg = Cout // G
  local y = {}
  for n = 1, B do
    y[n] = {}
    for co = 1, Cout do
      local g = (co - 1) // Mg
      y[n][co] = {}
      for oh = 1, Ho do
        y[n][co][oh] = {}
        for ow = 1, Wo do
          local s = Bt and Bt[co] or 0
          for c = 1, Cg do
            for ki = 1, kh do
              for kj = 1, kw do
                local ih = (oh - 1) * sh - ph + (ki - 1) * dh + 1
                local iw = (ow - 1) * sw - pw + (kj - 1) * dw + 1
                if ih >= 1 and ih <= Hh and iw >= 1 and iw <= Ww then
                  s = s + X[n][g * Cg + c][ih][iw] * Wt[co][c][ki][kj]
                end
              end
            end
          end
          y[n][co][oh][ow] = s
        end
      end
    end
  end
  return y, {B, Cout, Ho, Wo}
end

-- direct transposed convolution (each input pixel scatters w into the output):
-- x [B, Cin, H, W], w [Cin, Cout/G, kh, kw]
local function ref_conv_transpose2d(x, w, b, o)
  o = o or {}
  local sh, sw = pair(o.stride or 1)
  local ph, pw = pair(o.padding or 0)
  local oph, opw = pair(o.output_padding or 0)
  local dh, dw = pair(o.dilation or 1)
  local G = o.groups or 1
  local X, Wt, Bt = x:tolist(), w:tolist(), b and b:tolist()
  local B, Cin, Hh, Ww = table.unpack(x.shape)
  local _, Mg, kh, kw = table.unpack(w.shape)
  local Cout, Cg = Mg * G, Cin // G
  local Ho = (Hh - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
  local Wo = (Ww - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
  local y = {}
  for n = 1, B do
    y[n] = {}
    for co = 1, Cout do
      y[n][co] = {}
      for oh = 1, Ho do
        y[n][co][oh] = {}
        for ow = 1, Wo do y[n][co][oh][ow] = Bt and Bt[co] or 0 end
      end
    end
    for ci = 1, Cin do
      local g = (ci - 1) // Cg
      for ih = 1, Hh do
        for iw = 1, Ww do
          for m = 1, Mg do
            for ki = 1, kh do
              for kj = 1, kw do
                local oh = (ih - 1) * sh - ph + (ki - 1) * dh + 1
                local ow = (iw - 1) * sw - pw + (kj - 1) * dw + 1
                if oh >= 1 and oh <= Ho and ow >= 1 and ow <= Wo then
                  local row = y[n][g * Mg + m][oh]
                  row[ow] = row[ow] + X[n][ci][ih][iw] * Wt[ci][m][ki][kj]
                end
              end
            end
          end
        end
      end
    end
  end
  return y, {B, Cout, Ho, Wo}
end

local function ref_nearest(x, oh, ow)
  local X = x:tolist()
  local B, C, Hh, Ww = table.unpack(x.shape)
  local y = {}
  for n = 1, B do
    y[n] = {}
    for c = 1, C do
      y[n][c] = {}
      for i = 0, oh - 1 do
        y[n][c][i + 1] = {}
        for j = 0, ow - 1 do y[n][c][i + 1][j + 1] = X[n][c][i * Hh // oh + 1][j * Ww // ow + 1] end
      end
    end
  end
  return y
end

-- H.close reads tensors through f32; compare f64 results as tables to keep their precision
local function close64(t, ref, tol, msg) return H.close(t:tolist(), ref, tol, msg) end

local function same_shape(t, shape)
  assert.are.same(shape, t.shape)
end

describe("conv2d", function()
  local cases = {
    {name = "plain 3x3", x = {2, 3, 5, 6}, w = {4, 3, 3, 3}, o = {}},
    {name = "stride 2, padding 1", x = {1, 2, 7, 6}, w = {3, 2, 3, 3}, o = {stride = 2, padding = 1}},
    {name = "dilation 2", x = {1, 2, 7, 7}, w = {2, 2, 3, 2}, o = {dilation = 2, padding = {1, 0}}},
    {name = "groups 2", x = {2, 4, 5, 5}, w = {6, 2, 3, 3}, o = {groups = 2, padding = 1}},
    {name = "depthwise, pairs", x = {1, 3, 6, 5}, w = {3, 1, 3, 2}, o = {groups = 3, stride = {2, 1}, padding = {1, 2}}},
    {name = "1x1", x = {2, 3, 4, 4}, w = {5, 3, 1, 1}, o = {}},
  }
  for _, c in ipairs(cases) do
    it("matches the direct loop: " .. c.name, function()
      keng.manual_seed(1)
      local x, w, b = keng.randn(c.x, {dtype = "f64"}), keng.randn(c.w, {dtype = "f64"}), keng.randn({c.w[1]}, {dtype = "f64"})
      local ref, shape = ref_conv2d(x, w, b, c.o)
      local y = keng.conv2d(x, w, b, c.o)
      same_shape(y, shape)
      close64(y, ref, 1e-12, c.name)
      local y32 = keng.conv2d(x:float(), w:float(), nil, c.o)
      assert.are.equal("f32", y32.dtype)
      H.close(y32, (ref_conv2d(x, w, nil, c.o)), 1e-5, c.name .. " f32")
    end)
  end

  it("matches the direct loop at a size that runs the parallel paths", function()
    keng.manual_seed(6)
    local x, w, b = keng.randn({1, 8, 24, 24}), keng.randn({4, 8, 3, 3}), keng.randn({4})
    H.close(keng.conv2d(x, w, b, {padding = 1}), (ref_conv2d(x, w, b, {padding = 1})), 1e-5)
    local wt = keng.randn({4, 8, 3, 3})
    local xt = keng.randn({1, 4, 24, 24})
    H.close(keng.conv_transpose2d(xt, wt, nil, {}), (ref_conv_transpose2d(xt, wt, nil, {})), 1e-5)
  end)

  -- the CPU kernel cuts the output pixels into tiles of 256 columns (several small images per
  -- tile) and runs the stride-1 data gradient as a conv with the flipped kernel: these shapes
  -- cross tile edges mid-row, end on partial tiles, and take each data-gradient path
  local tiled = {
    {name = "3x3, 17x19 pixels, 3 tiles per image", x = {2, 3, 17, 19}, w = {4, 3, 3, 3}, o = {padding = 1}},
    {name = "5 images of 9x10 per tile, partial last tile", x = {7, 2, 9, 10}, w = {3, 2, 3, 3}, o = {padding = {1, 2}}},
    {name = "1x1 across tiles", x = {3, 4, 16, 17}, w = {5, 4, 1, 1}, o = {}},
    {name = "1x1, images folded", x = {5, 3, 6, 7}, w = {2, 3, 1, 1}, o = {}},
    {name = "groups, dilation, tiles", x = {2, 4, 18, 15}, w = {6, 2, 3, 2}, o = {groups = 2, dilation = {2, 1}, padding = {2, 1}}},
    {name = "padding beyond the kernel (col2im path)", x = {2, 2, 6, 5}, w = {3, 2, 3, 3}, o = {padding = 3}},
    {name = "stride 2, tiles", x = {3, 2, 35, 33}, w = {2, 2, 3, 3}, o = {stride = 2, padding = 1}},
    {name = "stride 2, col2im in chunks of 2 + 1 images", x = {3, 1, 84, 100}, w = {2, 1, 3, 3}, o = {stride = 2, padding = 1}},
  }
  for _, c in ipairs(tiled) do
    it("matches the direct loop with its gradients: " .. c.name, function()
      keng.manual_seed(8)
      local x, w, b = H.leaf(c.x), H.leaf(c.w), H.leaf({c.w[1]})
      local ref, shape = ref_conv2d(x, w, b, c.o)
      local y = keng.conv2d(x, w, b, c.o)
      same_shape(y, shape)
      close64(y, ref, 1e-12, c.name)
      -- gradients of sum(y * r) against the same conv run one image and one output channel
      -- at a time (those take the untiled single-image and direct paths)
      local r = keng.randn(shape, {dtype = "f64"})
      ;(y * r):sum():backward()
      local gx, gw, gb = x.grad, w.grad, b.grad
      local ex = keng.zeros(c.x, {dtype = "f64"})
      for n = 1, c.x[1] do
        local xn = x:detach():narrow(1, n, 1)
        xn.requires_grad = true
        ;(keng.conv2d(xn, w:detach(), nil, c.o) * r:narrow(1, n, 1)):sum():backward()
        ex[n] = xn.grad[1]
      end
      close64(gx, ex:tolist(), 1e-10, c.name .. " dx")
      -- dw[co] = sum over images and pixels of r[co] times the input window: finite differences
      -- in w are exact for a linear map, so compare with (f(w + e) - f(w - e)) / 2 on a few entries
      local function f(wv) return (keng.conv2d(x:detach(), wv, nil, c.o) * r):sum():item() end
      local wl = w:detach()
      for _, idx in ipairs({{1, 1, 1, 1}, {c.w[1], c.w[2], c.w[3], c.w[4]}}) do
        local e = keng.zeros(c.w, {dtype = "f64"})
        e[idx[1]][idx[2]][idx[3]][idx[4]] = 1
        local fd = (f(wl + e) - f(wl - e)) / 2
        H.close(gw[idx[1]][idx[2]][idx[3]][idx[4]]:item(), fd, 1e-9, c.name .. " dw")
      end
      close64(gb, r:sum({1, 3, 4}):tolist(), 1e-10, c.name .. " db")
    end)
  end

  it("splits tiles among threads and sums their weight gradients", function()
    keng.manual_seed(10)
    local x, w, b = H.leaf({4, 8, 24, 24}), H.leaf({8, 8, 3, 3}), H.leaf({8})
    local r = keng.randn({4, 8, 24, 24}, {dtype = "f64"})
    ;(keng.conv2d(x, w, b, {padding = 1}) * r):sum():backward()
    local sw = keng.zeros({8, 8, 3, 3}, {dtype = "f64"})
    for n = 1, 4 do -- one image each: below the size that runs in parallel
      local wn = w:detach()
      wn.requires_grad = true
      ;(keng.conv2d(x:detach():narrow(1, n, 1), wn, nil, {padding = 1}) * r:narrow(1, n, 1)):sum():backward()
      sw = sw + wn.grad
    end
    close64(w.grad, sw:tolist(), 1e-10)
    close64(keng.conv2d(x:detach(), w:detach(), b:detach(), {padding = 1}),
      (ref_conv2d(x:detach(), w:detach(), b:detach(), {padding = 1})), 1e-12)
  end)

  it("f32 and bf16 at tiled sizes match f64", function()
    keng.manual_seed(9)
    local x, w, b = keng.randn({3, 8, 20, 21}, {dtype = "f64"}), keng.randn({6, 8, 3, 3}, {dtype = "f64"}), keng.randn({6}, {dtype = "f64"})
    local ref = keng.conv2d(x, w, b, {padding = 1})
    H.close(keng.conv2d(x:float(), w:float(), b:float(), {padding = 1}), ref:float(), 1e-4)
    H.close(keng.conv2d(H.noncontig(x:float()), w:float(), b:float(), {padding = 1}), ref:float(), 1e-4)
    local yb = keng.conv2d(x:bf16(), w:bf16(), b:bf16(), {padding = 1})
    assert.are.equal("bf16", yb.dtype)
    H.close(yb:float(), keng.conv2d(x:bf16():double(), w:bf16():double(), b:bf16():double(), {padding = 1}):float(), 0.1)
  end)

  -- batches of small f32 images (16x16 and below, at least 4 images, 16+ input and output
  -- channels) take the direct kernel (AVX-512 or AVX2, when the CPU has it): images in register
  -- blocks of up to 14 (AVX2: 6), output channels in blocks of 32 (16), padding taps skipped;
  -- the stride-1 data gradient runs through it too. Checked against f64 (the GEMM path, itself checked by
  -- finite differences below); tests/lab/lab_conv.c checks every variant at more shapes.
  local batched = {
    {name = "13 images 4x4, padding 1", x = {13, 16, 4, 4}, w = {32, 16, 3, 3}, o = {padding = 1}},
    {name = "15 images (blocks 8 + 7), 37 channels (tail)", x = {15, 17, 3, 7}, w = {37, 17, 3, 3}, o = {padding = 1}},
    {name = "2x2 images, padding beyond the image", x = {6, 16, 2, 2}, w = {16, 16, 3, 3}, o = {padding = 1}},
    {name = "stride 2", x = {7, 16, 9, 9}, w = {17, 16, 3, 3}, o = {stride = 2, padding = 1}},
    {name = "groups 2", x = {14, 32, 4, 4}, w = {32, 16, 3, 3}, o = {groups = 2, padding = 1}},
    {name = "30 images, dilation 2, padding 2", x = {30, 16, 5, 5}, w = {20, 16, 3, 3}, o = {dilation = 2, padding = 2}},
    {name = "1x1 image", x = {4, 16, 1, 1}, w = {16, 16, 3, 3}, o = {padding = 1}},
  }
  for _, c in ipairs(batched) do
    it("f32 batches of small images match f64 with gradients: " .. c.name, function()
      keng.manual_seed(12)
      local x, w, b = H.leaf(c.x), H.leaf(c.w), H.leaf({c.w[1]})
      local ref, shape = ref_conv2d(x, w, b, c.o)
      local r = keng.randn(shape, {dtype = "f64"})
      ;(keng.conv2d(x, w, b, c.o) * r):sum():backward()
      local xf, wf, bf = x:detach():float(), w:detach():float(), b:detach():float()
      xf.requires_grad, wf.requires_grad, bf.requires_grad = true, true, true
      local y = keng.conv2d(xf, wf, bf, c.o)
      same_shape(y, shape)
      H.close(y, ref, 1e-5, c.name)
      ;(y * r:float()):sum():backward()
      H.close(xf.grad, x.grad:float(), 1e-5, c.name .. " dx")
      H.close(wf.grad, w.grad:float(), 1e-4, c.name .. " dw")
      H.close(bf.grad, b.grad:float(), 1e-4, c.name .. " db")
      local xn = c.x[3] * c.x[4] > 1 and H.noncontig(xf:detach()) or xf:detach() -- a 1x1 view stays contiguous
      H.close(keng.conv2d(xn, H.noncontig(wf:detach()), bf:detach(), c.o), y, 0, c.name .. " noncontig")
    end)
  end

  -- f32 1x1 convs (unit stride, no padding) on images of fewer than 256 pixels run on an AVX-512
  -- kernel of their own (engine/cpu/conv.c, "pointwise convs on small images", when the CPU has
  -- it): 8 output channels x 32 columns per block, pixel counts that are multiples of 16 read in
  -- place, others gathered [C, B*P]; the data gradient (a 1x1 conv with the transposed kernel)
  -- runs through it too. Row tails (37 = 4 x 8 + 5), column tails, groups; against f64.
  local pointwise = {
    {name = "13 images 4x4 (in place), 37 output channels", x = {13, 40, 4, 4}, w = {37, 40, 1, 1}},
    {name = "13 images 2x2 (gathered, 52 columns)", x = {13, 24, 2, 2}, w = {16, 24, 1, 1}},
    {name = "5 images 1x1, 3 channels in", x = {5, 3, 1, 1}, w = {9, 3, 1, 1}},
    {name = "one image 5x3, 1 channel out", x = {1, 17, 5, 3}, w = {1, 17, 1, 1}},
    {name = "3 images 8x8, groups 2", x = {3, 16, 8, 8}, w = {20, 8, 1, 1}, o = {groups = 2}},
    {name = "no bias", x = {4, 8, 4, 4}, w = {11, 8, 1, 1}, nobias = true},
    {name = "1x1 with stride 2 (other path)", x = {6, 8, 5, 5}, w = {10, 8, 1, 1}, o = {stride = 2}},
    {name = "1x1 with padding 1 (other path)", x = {6, 8, 3, 3}, w = {10, 8, 1, 1}, o = {padding = 1}},
  }
  for _, c in ipairs(pointwise) do
    it("f32 pointwise convs on small images match f64 with gradients: " .. c.name, function()
      keng.manual_seed(17)
      local o = c.o or {}
      local x, w, b = H.leaf(c.x), H.leaf(c.w), not c.nobias and H.leaf({c.w[1]}) or nil
      local ref, shape = ref_conv2d(x, w, b, o)
      local r = keng.randn(shape, {dtype = "f64"})
      ;(keng.conv2d(x, w, b, o) * r):sum():backward()
      local xf, wf, bf = x:detach():float(), w:detach():float(), b and b:detach():float()
      xf.requires_grad, wf.requires_grad = true, true
      local y = keng.conv2d(xf, wf, bf, o)
      same_shape(y, shape)
      H.close(y, ref, 1e-5, c.name)
      ;(y * r:float()):sum():backward()
      H.close(xf.grad, x.grad:float(), 1e-5, c.name .. " dx")
      H.close(wf.grad, w.grad:float(), 1e-4, c.name .. " dw")
      local xn = c.x[3] * c.x[4] > 1 and H.noncontig(xf:detach()) or xf:detach() -- a 1x1 view stays contiguous
      local wn = wf:detach():transpose(1, 2):contiguous():transpose(1, 2) -- [M, C, 1, 1] stored [C, M]
      H.close(keng.conv2d(xn, wn, bf, o), y, 0, c.name .. " noncontig")
    end)
  end

  it("f32 pointwise convs on small images match f64 on one and two threads", function()
    -- large enough (2.9 MFLOP) that the blocks are shared among the threads
    keng.manual_seed(18)
    local x, w, b = keng.randn({13, 96, 4, 4}, {dtype = "f64"}), keng.randn({72, 96, 1, 1}, {dtype = "f64"}),
      keng.randn({72}, {dtype = "f64"})
    local ref = keng.conv2d(x, w, b):float()
    local nt = keng.num_threads()
    local ok, err = pcall(function()
      for _, t in ipairs({1, 2}) do
        keng.set_num_threads(t)
        H.close(keng.conv2d(x:float(), w:float(), b:float()), ref, 1e-4, t .. " threads")
        local x2 = keng.randn({13, 96, 2, 2}, {dtype = "f64"})
        H.close(keng.conv2d(x2:float(), w:float(), b:float()), keng.conv2d(x2, w, b):float(), 1e-4, t .. " threads, 2x2")
      end
    end)
    keng.set_num_threads(nt)
    assert(ok, err)
  end)

  -- f32 3x3 convs with stride 1 at 8x8 and more output pixels, 8+ input and 16+ output
  -- channels take Winograd F(4x4, 3x3) when the CPU has AVX2+FMA (engine/cpu/conv_winograd.c):
  -- 6x6 input tiles, partial tiles at the right and bottom edges, any padding; the stride-1
  -- data gradient (a conv of dy with the flipped kernel, 16+ input channels) runs through it
  -- too, and so does the weight gradient (the transposed algorithm, images of 64+ output
  -- pixels; KENG_CONV_WINOGRAD_DW=0 leaves it to the other paths): the " dw" checks below.
  -- Checked against f64 (the GEMM path); tests/lab/lab_conv.c checks it forced at every
  -- H, W in 1..11 and padding 0..2. KENG_CONV_WINOGRAD=0 switches it off.
  local winograd = {
    {name = "13x11, padding 1, dx too", x = {2, 16, 13, 11}, w = {20, 16, 3, 3}, o = {padding = 1}},
    {name = "padding 2, odd channels", x = {1, 9, 10, 9}, w = {17, 9, 3, 3}, o = {padding = 2}},
    {name = "padding 0, 3 images", x = {3, 12, 12, 14}, w = {33, 12, 3, 3}, o = {padding = 0}},
    {name = "asymmetric padding, dx (padding 2, 0)", x = {2, 24, 9, 12}, w = {16, 24, 3, 3}, o = {padding = {0, 2}}},
  }
  for _, c in ipairs(winograd) do
    it("f32 Winograd-size convs match f64 with gradients: " .. c.name, function()
      keng.manual_seed(14)
      -- weights at the scale of an initialised layer (1/sqrt(C*9)): Winograd's rounding error
      -- follows the magnitudes of the whole 6x6 tile, so with N(0, 1) weights (outputs ~17) a
      -- corner output of a few terms misses 1e-4 of 1 + |y| (seen: 1.35e-4 at |y| = 0.34)
      local x, w, b = H.leaf(c.x), H.leaf(c.w, 1 / math.sqrt(c.w[2] * 9)), H.leaf({c.w[1]})
      local ref, shape = ref_conv2d(x, w, b, c.o)
      local r = keng.randn(shape, {dtype = "f64"})
      ;(keng.conv2d(x, w, b, c.o) * r):sum():backward()
      local xf, wf, bf = x:detach():float(), w:detach():float(), b:detach():float()
      xf.requires_grad, wf.requires_grad, bf.requires_grad = true, true, true
      local y = keng.conv2d(xf, wf, bf, c.o)
      same_shape(y, shape)
      H.close(y, ref, 1e-4, c.name)
      ;(y * r:float()):sum():backward()
      H.close(xf.grad, x.grad:float(), 1e-4, c.name .. " dx")
      -- dw sums over every tile of every image; on one thread that is one long f32 sum (seen:
      -- 1.03e-4 at 0.22, "padding 0, 3 images", KENG_NUM_THREADS=1), two threads add two halves
      H.close(wf.grad, w.grad:float(), 2e-4, c.name .. " dw")
      H.close(keng.conv2d(H.noncontig(xf:detach()), H.noncontig(wf:detach()), bf:detach(), c.o), y, 0,
        c.name .. " noncontig")
    end)
  end

  it("f32 Winograd at VAE-like sizes (several tile blocks, two threads) matches f64", function()
    keng.manual_seed(15)
    local x, w, b = keng.randn({2, 40, 37, 34}, {dtype = "f64"}), keng.randn({48, 40, 3, 3}, {dtype = "f64"}) * 0.1,
      keng.randn({48}, {dtype = "f64"})
    local ref = keng.conv2d(x, w, b, {padding = 1})
    local y = keng.conv2d(x:float(), w:float(), b:float(), {padding = 1})
    H.close(y, ref:float(), 1e-4)
    -- relative to the largest output: 4.4e-6 by Winograd, 4.4e-7 by the GEMM path
    local err = (y:double() - ref):abs():max():item() / ref:abs():max():item()
    assert(err < 1e-5, string.format("max error %.3g of the largest output", err))
    -- conv_transpose2d with stride 1 is the flipped-kernel conv: Winograd too
    local xt, wt = keng.randn({2, 24, 12, 13}, {dtype = "f64"}), keng.randn({24, 16, 3, 3}, {dtype = "f64"})
    local rt = keng.conv_transpose2d(xt, wt, nil, {padding = 1})
    H.close(keng.conv_transpose2d(xt:float(), wt:float(), nil, {padding = 1}), rt:float(), 1e-4, "conv_transpose2d")
  end)

  it("f32 Winograd weight gradient over several tile blocks per thread matches f64", function()
    -- dw by the transposed Winograd (36 GEMMs reducing over the 4x4 tiles of all images): each
    -- thread sums several blocks of tile rows into its partial, the partials are then added
    keng.manual_seed(16)
    local x, w = H.leaf({4, 16, 64, 60}), H.leaf({24, 16, 3, 3}, 1 / math.sqrt(16 * 9))
    local r = keng.randn({4, 24, 62, 58}, {dtype = "f64"})
    ;(keng.conv2d(x, w, nil, {padding = 0}) * r):sum():backward()
    local xf, wf = x:detach():float(), w:detach():float()
    wf.requires_grad = true
    ;(keng.conv2d(xf, wf, nil, {padding = 0}) * r:float()):sum():backward()
    -- relative to the largest entry of dw (a sum of 57k terms): 4.9e-6 by Winograd, 3.4e-7
    -- by the direct kernel (KENG_CONV_WINOGRAD_DW=0); a block's sum dropped: 0.7
    local err = (wf.grad:double() - w.grad):abs():max():item() / w.grad:abs():max():item()
    assert(err < 2e-5, string.format("dw max error %.3g of the largest entry", err))
  end)

  it("gradients match finite differences for a batch of small images", function()
    keng.manual_seed(13)
    local x, w, b = H.leaf({4, 16, 2, 3}), H.leaf({16, 16, 3, 3}), H.leaf({16})
    H.gradcheck(function(x_, w_, b_) return keng.conv2d(x_, w_, b_, {padding = 1}) end, {x, w, b})
  end)

  it("works as a method and without options", function()
    local x, w = keng.randn({1, 1, 4, 4}), keng.randn({1, 1, 2, 2})
    same_shape(x:conv2d(w), {1, 1, 3, 3})
    H.close(x:conv2d(w), keng.conv2d(x, w, nil, {}), 0)
  end)

  it("takes non-contiguous input and weight", function()
    local x, w = keng.randn({2, 3, 5, 4}, {dtype = "f64"}), keng.randn({2, 3, 2, 3}, {dtype = "f64"})
    local xn, wn = H.noncontig(x), H.noncontig(w)
    local o = {stride = {1, 2}, padding = 1}
    close64(keng.conv2d(xn, wn, nil, o), (ref_conv2d(x, w, nil, o)), 1e-12)
  end)

  it("computes bf16 and f16 in f32", function()
    keng.manual_seed(2)
    local x, w, b = keng.randn({1, 4, 6, 6}), keng.randn({4, 2, 3, 3}), keng.randn({4})
    local o = {groups = 2, padding = 1}
    local ref = keng.conv2d(x:to("bf16"):float(), w:to("bf16"):float(), b:to("bf16"):float(), o)
    local y = keng.conv2d(x:to("bf16"), w:to("bf16"), b:to("bf16"), o)
    assert.are.equal("bf16", y.dtype)
    H.close(y, ref, 1e-2)
    local yh = keng.conv2d(x:to("f16"), w:to("f16"), b:to("f16"), o)
    assert.are.equal("f16", yh.dtype)
    H.close(yh, keng.conv2d(x:to("f16"):float(), w:to("f16"):float(), b:to("f16"):float(), o), 2e-3)
  end)

  it("gradients match finite differences", function()
    local function gc(xs, ws, o, bias)
      keng.manual_seed(3)
      local x, w = H.leaf(xs), H.leaf(ws)
      local b = bias and H.leaf({ws[1]}) or nil
      H.gradcheck(function(x_, w_, b_) return keng.conv2d(x_, w_, b_, o) end, {x, w, b})
    end
    gc({1, 2, 5, 5}, {3, 2, 3, 3}, {}, true)
    gc({1, 2, 5, 5}, {2, 2, 3, 3}, {stride = 2, padding = 1}, true)
    gc({1, 2, 5, 5}, {2, 2, 2, 2}, {dilation = 2, padding = 1}, false)
    gc({2, 2, 5, 5}, {4, 1, 3, 2}, {groups = 2, stride = {2, 1}, padding = {1, 0}, dilation = {1, 2}}, true)
    gc({1, 3, 3, 4}, {2, 3, 1, 1}, {}, true)
  end)

  it("gives a gradient only to inputs that need one", function()
    local x = H.leaf({1, 2, 4, 4})
    local w = keng.randn({3, 2, 3, 3}, {dtype = "f64"})
    keng.conv2d(x, w, nil, {padding = 1}):sum():backward()
    assert.is_nil(w.grad)
    same_shape(x.grad, {1, 2, 4, 4})
    -- d(sum y)/dx = sum over the output positions that read x: check one interior pixel
    local wl = w:tolist()
    local s = 0
    for co = 1, 3 do for ki = 1, 3 do for kj = 1, 3 do s = s + wl[co][1][ki][kj] end end end
    H.close(x.grad[1][1][2][2]:item(), s, 1e-10)
  end)

  it("reports bad shapes", function()
    local x = keng.randn({1, 4, 5, 5})
    H.raises(function() keng.conv2d(keng.randn({4, 5, 5}), keng.randn({2, 4, 3, 3})) end, "conv2d: input x [4,5,5] must be 4-D")
    H.raises(function() keng.conv2d(x, keng.randn({2, 3, 3, 3})) end, "conv2d: x [1,4,5,5], weight [2,3,3,3]: channel mismatch")
    H.raises(function() keng.conv2d(x, keng.randn({3, 2, 3, 3}), nil, {groups = 2}) end,
      "conv2d: weight [3,2,3,3]: 3 output channels are not divisible by groups=2")
    H.raises(function() keng.conv2d(x, keng.randn({3, 1, 3, 3}), nil, {groups = 3}) end,
      "conv2d: x [1,4,5,5]: 4 input channels are not divisible by groups=3")
    H.raises(function() keng.conv2d(x, keng.randn({2, 4, 6, 3})) end, "is larger than the padded input")
    H.raises(function() keng.conv2d(x, keng.randn({2, 4, 3, 3}), nil, {dilation = 3}) end, "dilated kernel (7x7)")
    H.raises(function() keng.conv2d(x, keng.randn({2, 4, 3, 3}), keng.randn({3})) end, "conv2d: bias [3] must be [2]")
    H.raises(function() keng.conv2d(x, keng.randn({2, 4, 3, 3}), nil, {stride = 0}) end, "conv2d: stride")
    H.raises(function() keng.conv2d(x, keng.randn({2, 4, 3, 3}), nil, {stride = "x"}) end, "conv2d: stride must be")
  end)
end)

describe("conv_transpose2d", function()
  local cases = {
    {name = "plain", x = {2, 3, 4, 3}, w = {3, 2, 3, 3}, o = {}},
    {name = "stride 2, padding 1, output_padding 1", x = {1, 2, 3, 4}, w = {2, 3, 3, 3},
     o = {stride = 2, padding = 1, output_padding = 1}},
    {name = "dilation 2, groups 2", x = {1, 4, 3, 3}, w = {4, 1, 2, 3}, o = {dilation = 2, groups = 2, padding = {0, 1}}},
    {name = "pairs", x = {1, 2, 3, 3}, w = {2, 2, 2, 2}, o = {stride = {2, 3}, output_padding = {1, 0}}},
  }
  for _, c in ipairs(cases) do
    it("matches the direct loop: " .. c.name, function()
      keng.manual_seed(4)
      local Cout = c.w[2] * (c.o.groups or 1)
      local x, w, b = keng.randn(c.x, {dtype = "f64"}), keng.randn(c.w, {dtype = "f64"}), keng.randn({Cout}, {dtype = "f64"})
      local ref, shape = ref_conv_transpose2d(x, w, b, c.o)
      local y = keng.conv_transpose2d(x, w, b, c.o)
      same_shape(y, shape)
      close64(y, ref, 1e-12, c.name)
      H.close(keng.conv_transpose2d(H.noncontig(x:float()), w:float(), nil, c.o), (ref_conv_transpose2d(x, w, nil, c.o)),
        1e-5, c.name .. " f32 non-contiguous")
    end)
  end

  it("inverts conv2d's shape with a stride", function()
    local x = keng.randn({1, 2, 8, 8})
    local w = keng.randn({3, 2, 3, 3})
    local y = keng.conv2d(x, w, nil, {stride = 2, padding = 1})
    same_shape(y, {1, 3, 4, 4})
    same_shape(keng.conv_transpose2d(y, w, nil, {stride = 2, padding = 1, output_padding = 1}), {1, 2, 8, 8})
  end)

  it("gradients match finite differences", function()
    local function gc(xs, ws, o, bias)
      keng.manual_seed(5)
      local x, w = H.leaf(xs), H.leaf(ws)
      local b = bias and H.leaf({ws[2] * (o.groups or 1)}) or nil
      H.gradcheck(function(x_, w_, b_) return keng.conv_transpose2d(x_, w_, b_, o) end, {x, w, b})
    end
    gc({1, 2, 3, 3}, {2, 3, 3, 3}, {}, true)
    gc({1, 2, 3, 3}, {2, 2, 3, 3}, {stride = 2, padding = 1, output_padding = 1}, true)
    gc({2, 4, 3, 2}, {4, 1, 2, 2}, {dilation = 2, groups = 2}, true)
  end)

  it("computes bf16 in f32", function()
    local x, w = keng.randn({1, 2, 3, 3}), keng.randn({2, 2, 3, 3})
    local y = keng.conv_transpose2d(x:bf16(), w:bf16(), nil, {stride = 2})
    assert.are.equal("bf16", y.dtype)
    H.close(y, keng.conv_transpose2d(x:bf16():float(), w:bf16():float(), nil, {stride = 2}), 1e-2)
  end)

  it("reports bad shapes", function()
    local x = keng.randn({1, 4, 3, 3})
    H.raises(function() keng.conv_transpose2d(x, keng.randn({3, 2, 3, 3})) end,
      "conv_transpose2d: x [1,4,3,3], weight [3,2,3,3]: channel mismatch")
    H.raises(function() keng.conv_transpose2d(x, keng.randn({4, 2, 3, 3}), nil, {groups = 3}) end,
      "conv_transpose2d: x [1,4,3,3]: 4 input channels are not divisible by groups=3")
    H.raises(function() keng.conv_transpose2d(x, keng.randn({4, 2, 3, 3}), nil, {stride = 2, output_padding = 2}) end,
      "conv_transpose2d: output_padding (2, 2) must be")
    H.raises(function() keng.conv_transpose2d(x:reshape{4, 3, 3}, keng.randn({4, 2, 3, 3})) end,
      "conv_transpose2d: input x [4,3,3] must be 4-D")
    H.raises(function() keng.conv_transpose2d(x, keng.randn({4, 2, 3, 3}), nil, {padding = 3}) end, "output would be empty")
  end)
end)

describe("interpolate", function()
  it("nearest matches PyTorch's index rule", function()
    local x = keng.randn({2, 3, 3, 5})
    H.close(keng.interpolate(x, {scale = 2}), ref_nearest(x, 6, 10), 0)
    H.close(keng.interpolate(x, {size = {4, 3}}), ref_nearest(x, 4, 3), 0)
    H.close(keng.interpolate(x, {size = {7, 11}, mode = "nearest"}), ref_nearest(x, 7, 11), 0)
    H.close(x:interpolate{scale = {1, 0.5}}, ref_nearest(x, 3, 2), 0)
    -- the exact values of a 2x2 upscale of [[1,2],[3,4]]
    local t = keng.tensor({{{{1, 2}, {3, 4}}}})
    assert.are.same({{{{1, 1, 2, 2}, {1, 1, 2, 2}, {3, 3, 4, 4}, {3, 3, 4, 4}}}}, keng.interpolate(t, {scale = 2}):tolist())
  end)

  it("matches at a size that runs the parallel paths, forward and backward", function()
    local x = keng.randn({2, 4, 40, 40})
    H.close(keng.interpolate(x, {scale = 2}), ref_nearest(x, 80, 80), 0)
    local xl = x:detach()
    xl.requires_grad = true
    keng.interpolate(xl, {size = {80, 120}}):sum():backward()
    H.close(xl.grad, keng.full({2, 4, 40, 40}, 6), 0)
  end)

  it("keeps the dtype and takes non-contiguous input", function()
    local x = keng.randn({1, 2, 4, 3})
    local y = keng.interpolate(H.noncontig(x:bf16()), {size = {5, 5}})
    assert.are.equal("bf16", y.dtype)
    H.close(y, ref_nearest(x:bf16(), 5, 5), 0)
  end)

  it("gradients match finite differences (up and down)", function()
    H.gradcheck(function(x) return keng.interpolate(x, {scale = 2}) end, {H.leaf({1, 2, 3, 2})})
    H.gradcheck(function(x) return keng.interpolate(x, {size = {5, 3}}) end, {H.leaf({2, 1, 3, 4})})
    H.gradcheck(function(x) return keng.interpolate(x, {size = {2, 2}}) end, {H.leaf({1, 1, 5, 4})})
  end)

  it("sums the gradient of every copy into its source", function()
    local x = H.leaf({1, 1, 2, 2})
    keng.interpolate(x, {scale = 3}):sum():backward()
    H.close(x.grad, {9, 9, 9, 9}, 0)
  end)

  it("reports bad input", function()
    H.raises(function() keng.interpolate(keng.randn({2, 3, 4}), {scale = 2}) end, "interpolate: input x [2,3,4] must be 4-D")
    H.raises(function() keng.interpolate(keng.randn({1, 1, 2, 2}), {scale = 2, mode = "linear"}) end,
      "interpolate: unknown mode 'linear'")
    H.raises(function() keng.interpolate(keng.randn({1, 1, 2, 2}), {}) end, "interpolate: give scale= or size=")
    H.raises(function() keng.interpolate(keng.randn({1, 1, 2, 2}), {size = {0, 2}}) end, "interpolate: x [1,1,2,2]: output size 0x2")
  end)
end)
