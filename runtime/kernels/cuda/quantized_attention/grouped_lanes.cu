    constexpr int KPI = 4;       // keys a warp per trip
    constexpr int PER = D / 32;  // dims of a key a lane holds
    const int off = lane * PER;
