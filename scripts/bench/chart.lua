-- chart.lua — the benchmark bar chart: per row, keng vs Keras (and an optional peer) in ms/step
-- on a log scale, drawn with keng.image (narrow + fill_) and written as PNG.
--   chart.draw(path, groups, {title = "...", series = {"keng", "Keras 3 best", "PyTorch"}})
-- groups: list of {label = {"BERT", "FIT"}, values = {ms or nil, ...}} (one value per series).
local image = require "keng.image"

local chart = {}

local colors = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {148, 103, 189}}
local WHITE, BLACK, GRID, MUTED = {255, 255, 255}, {20, 20, 20}, {215, 215, 215}, {120, 120, 120}

local function decade_label(e)
  if e >= 0 then return tostring(math.tointeger(10 ^ e)) end
  return string.format("%." .. -e .. "f", 10 ^ e)
end

function chart.draw(path, groups, opts)
  opts = opts or {}
  local series = opts.series or {"keng", "Keras 3 best"}
  local ns, bar = #series, opts.bar or 12
  local group_w = math.max(ns * bar + 16, 56)
  local left, right, top, bottom = 56, 16, 48, 44
  local plot_h = opts.plot_h or 260
  local W = left + #groups * group_w + right
  local H = top + plot_h + bottom
  local img = image.new(H, W, WHITE)

  -- log range over every value present
  local lo, hi = math.huge, -math.huge
  for _, g in ipairs(groups) do
    for s = 1, ns do
      local v = g.values[s]
      if v and v > 0 then lo, hi = math.min(lo, v), math.max(hi, v) end
    end
  end
  if lo == math.huge then lo, hi = 1, 10 end
  local e0, e1 = math.floor(math.log(lo, 10)), math.ceil(math.log(hi, 10))
  if e1 == e0 then e1 = e0 + 1 end
  local y0 = top + plot_h                                           -- row of the axis
  local function ypos(v) return y0 - (math.log(v, 10) - e0) / (e1 - e0) * plot_h end

  -- grid and decade labels
  for e = e0, e1 do
    local y = math.floor(ypos(10 ^ e) + 0.5)
    image.fill_rect(img, left, y, W - left - right, 1, GRID)
    local lab = decade_label(e)
    image.text(img, left - 4 - image.text_width(lab), y - 3, lab, MUTED)
  end
  image.text(img, 4, top - 14, "MS/STEP", MUTED)
  image.fill_rect(img, left, y0, W - left - right, 1, BLACK)
  image.fill_rect(img, left, top, 1, plot_h + 1, BLACK)

  -- bars
  for i, g in ipairs(groups) do
    local gx = left + (i - 1) * group_w + (group_w - ns * bar) // 2
    for s = 1, ns do
      local v = g.values[s]
      local x = gx + (s - 1) * bar
      if v and v > 0 then
        local y = math.floor(ypos(v) + 0.5)
        image.fill_rect(img, x + 1, y, bar - 2, y0 - y, colors[(s - 1) % #colors + 1])
      else
        image.text(img, x + (bar - 5) // 2, y0 - 10, "-", MUTED)
      end
    end
    for l, text in ipairs(g.label) do
      local tx = left + (i - 1) * group_w + (group_w - image.text_width(text)) // 2
      image.text(img, tx, y0 + 6 + (l - 1) * 10, text, BLACK)
    end
  end

  -- title and legend
  image.text(img, left, 8, opts.title or "KENG BENCHMARKS", BLACK)
  local lx = left
  for s, name in ipairs(series) do
    image.fill_rect(img, lx, 24, 8, 8, colors[(s - 1) % #colors + 1])
    image.text(img, lx + 11, 25, name, BLACK)
    lx = lx + 11 + image.text_width(name) + 12
  end
  image.write_png(path, img)
  return img
end

return chart
