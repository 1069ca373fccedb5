-- args:
-- Read only: the fair-share standing of the teams with work (see shares_into).
local out = {}
shares_into(out)
return out
