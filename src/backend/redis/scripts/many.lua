-- What a coalesced script (`<name>_many`) runs: the script's body once per claim, each
-- starting afresh and failing alone. KEYS holds each claim's `nk` keys in turn; ARGV starts
-- with `nk`, `na` (each claim's own arguments), `ns` (the arguments every claim shares) and the
-- number of claims, then each claim's `na` own arguments, then the `ns` shared ones, once: a
-- claim's arguments are its own followed by the shared ones. Returns each claim's reply; for a
-- claim whose run raised an error, the error's text as a string (a coalesced script never
-- answers a string, and an error inside the reply would fail the whole call in the client).
--
-- `quick`, if given, is tried first for each claim, with the claim's place in `keys` and `argv`
-- (see `release_plain`; only a claim's own arguments are there): where it answers, the body
-- does not run for that claim (no tables built, no fresh start). It must raise no error and
-- change nothing where it does not answer.
--
-- `widen`, if given, rebuilds a claim's keys and own arguments, in place, from the fewer its
-- coalesced form sends (`Part::sends`), before the body runs (the shared arguments follow the
-- own ones in `a`).
local function many(run, keys, argv, quick, widen)
  local nk, na, ns, n = tonumber(argv[1]), tonumber(argv[2]), tonumber(argv[3]), tonumber(argv[4])
  local shared = 4 + n * na
  local out = {}
  for i = 0, n - 1 do
    local r = quick and quick(keys, argv, i * nk, 4 + i * na)
    if r == nil then
      local k, a = {}, {}
      for j = 1, nk do
        k[j] = keys[i * nk + j]
      end
      for j = 1, na do
        a[j] = argv[4 + i * na + j]
      end
      for j = 1, ns do
        a[na + j] = argv[shared + j]
      end
      if widen then
        widen(k, a)
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
