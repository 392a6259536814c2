    constexpr int VEC = CPL;            // codes of a key one lane holds (8 or 16, a template argument)
    constexpr int W = VEC * BITS / 32;  // 32-bit words of codes a lane loads a key (1, 2 or 4)
    constexpr int LPK = D / VEC;        // lanes per key
    constexpr int GPW = 32 / LPK;       // keys one warp-wide load covers
    constexpr int STRIDE = WARPS * GPW; // keys one block-wide load covers
    const int sub = lane % LPK;  // this lane's VEC dims of a key
    const int grp = lane / LPK;  // which of the warp's GPW keys
    const int off = sub * VEC;
