    constexpr int VEC = 8;              // codes of a key one lane holds
    constexpr int LPK = D / VEC;        // lanes per key
    constexpr int GPW = 32 / LPK;       // keys one warp-wide load covers
    constexpr int STRIDE = WARPS * GPW; // keys one block-wide load covers
    const int sub = lane % LPK;  // this lane's VEC dims of a key
    const int grp = lane / LPK;  // which of the warp's GPW keys
    const int off = sub * VEC;
