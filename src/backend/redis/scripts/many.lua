-- What a coalesced script (`<name>_many`) runs: the script's body once per claim, each
-- starting afresh and failing alone. KEYS holds each claim's `nk` keys in turn; ARGV starts
-- with `nk` and `na`, then each claim's `na` arguments. Returns each claim's reply; for a claim
-- whose run raised an error, the error's text as a string (a coalesced script never answers a
-- string, and an error inside the reply would fail the whole call in the client).
--
-- `quick`, if given, is tried first for each claim, with the claim's place in `keys` and `argv`
-- (see `release_plain`): where it answers, the body does not run for that claim (no tables
-- built, no fresh start). It must raise no error and change nothing where it does not answer.
local function many(run, keys, argv, quick)
  local nk, na = tonumber(argv[1]), tonumber(argv[2])
  local out = {}
  for i = 0, (#argv - 2) / na - 1 do
    local r = quick and quick(keys, argv, i * nk, 2 + i * na)
    if r == nil then
      local k, a = {}, {}
      for j = 1, nk do
        k[j] = keys[i * nk + j]
      end
      for j = 1, na do
        a[j] = argv[2 + i * na + j]
      end
      local ok
      ok, r = pcall(run, k, a)
      if not ok then
        if type(r) == 'table' and r.err then
          r = r.err
        else
          r = 'ERR ' .. tostring(r)
        end
      end
    end
    out[i + 1] = r
  end
  return out
end
